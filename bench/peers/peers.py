#!/usr/bin/env python3
"""Peers of ckpt on the same tensors: h5py, torch.save/torch.load, numpy.save/load.

    peers.py --inputs /dev/shm/inputs.bin --dir /dev/shm/peers --ranks 1,4 --repeats 3

The inputs are the raw float32 tensors written by `ckpt-bench-io --dump-inputs`
(PATH.json describes them): the very bytes ckpt saves. They are read once into
this process's anonymous memory before anything is timed. With R ranks, rank r
holds rows [rows*r/R, rows*(r+1)/R) of every tensor, as in ckpt-bench-io.

R ranks are R processes forked from this one (they share the inputs
copy-on-write, read-only), started together at a barrier; a figure is the
tensor bytes over the time from the first rank's start to the last rank's end.
Every rank writes its own file(s), like torch.distributed.checkpoint's per-rank
files:
  h5py   one HDF5 file per rank, one contiguous, uncompressed dataset per
         tensor piece (create_dataset(data=...)); loaded with read_direct into
         preallocated arrays (the in-place load h5py offers, as ckpt loads in
         place);
  torch  torch.save of the rank's dict {name: tensor} (tensors share the
         numpy memory) to one file per rank; torch.load of it (allocates);
  numpy  numpy.save of each piece to its own .npy file; numpy.load of each
         (allocates).
Durability is paid by everyone, inside the timed region: each written file is
fsync'd, then its directory (ckpt fsyncs its shard files and directories).
With --evict the files' cached pages are dropped (posix_fadvise DONTNEED)
before the loads, as ckpt-bench-io --evict does. Every load is compared with
the inputs after its timing. A peer whose module cannot be imported (or that fails)
is reported as skipped with the reason; nothing is ever estimated. Each figure
comes with the CPU time of its ranks (user + system) per GB.

The last line printed is one JSON object:
  {"peers": {"torch": {"1": {"save_GBps": [...], "load_GBps": [...]}, "4": ...}, ...},
   "skipped": {"h5py": "reason", ...}, ...}
"""

import argparse
import json
import multiprocessing as mp
import os
import resource
import shutil
import sys
import time

import numpy as np

PEERS = ("h5py", "torch", "numpy")


def cpu_now():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def evict(path):
    for root, _, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


# ---- the peers: save(dir, pieces) and load(dir, pieces) -> loaded arrays ----
# `pieces` is [(name, array)] of this rank; a load returns the arrays in that
# order, for verification.


def h5py_save(d, pieces):
    import h5py

    path = os.path.join(d, "rank.h5")
    with h5py.File(path, "w") as f:
        for name, a in pieces:
            f.create_dataset(name, data=a)
    fsync_path(path)


def h5py_prepare_load(pieces):
    # Destinations written once so that their pages exist, as ckpt's do.
    return [np.full(a.shape, -1, a.dtype) for _, a in pieces]


def h5py_load(d, pieces, dst):
    import h5py

    with h5py.File(os.path.join(d, "rank.h5"), "r") as f:
        for (name, _), out in zip(pieces, dst):
            f[name].read_direct(out)
    return dst


def torch_save(d, pieces):
    import torch

    path = os.path.join(d, "rank.pt")
    state = {name: torch.from_numpy(a) for name, a in pieces}
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def torch_load(d, pieces, _):
    import torch

    state = torch.load(os.path.join(d, "rank.pt"))
    return [state[name].numpy() for name, _ in pieces]


def numpy_save(d, pieces):
    for name, a in pieces:
        with open(os.path.join(d, name + ".npy"), "wb") as f:
            np.save(f, a)
            f.flush()
            os.fsync(f.fileno())


def numpy_load(d, pieces, _):
    return [np.load(os.path.join(d, name + ".npy")) for name, _ in pieces]


SAVE = {"h5py": h5py_save, "torch": torch_save, "numpy": numpy_save}
LOAD = {"h5py": h5py_load, "torch": torch_load, "numpy": numpy_load}
PREPARE = {"h5py": h5py_prepare_load}


def available(peer):
    """None if `peer` can run, else why not."""
    try:
        if peer == "h5py":
            import h5py  # noqa: F401
        elif peer == "torch":
            import torch  # noqa: F401
        return None
    except Exception as e:  # ImportError, or a broken installation
        return f"{type(e).__name__}: {e}"


# ---- ranks as processes ----

TENSORS = None  # [(name, array)], set before forking


def rank_pieces(rank, world):
    out = []
    for name, a in TENSORS:
        rows = a.shape[0]
        out.append((name, a[rows * rank // world : rows * (rank + 1) // world]))
    return out


def rank_main(peer, op, d, rank, world, barrier, conn):
    try:
        pieces = rank_pieces(rank, world)
        rd = os.path.join(d, f"rank{rank}")
        if op == "save":
            os.makedirs(rd, exist_ok=True)
        dst = PREPARE[peer](pieces) if op == "load" and peer in PREPARE else None
        barrier.wait()
        c0 = cpu_now()
        t0 = time.perf_counter()
        if op == "save":
            SAVE[peer](rd, pieces)
            fsync_path(rd)
        else:
            loaded = LOAD[peer](rd, pieces, dst)
        t1 = time.perf_counter()
        cpu = cpu_now() - c0
        if op == "load":
            for (name, a), b in zip(pieces, loaded):
                if a.shape != b.shape or a.dtype != b.dtype or not np.array_equal(a, b):
                    raise RuntimeError(f"{peer}: rank {rank} loaded '{name}' wrong")
        conn.send((t0, t1, cpu, None))
    except BaseException as e:  # reported by the parent
        conn.send((0.0, 0.0, 0.0, f"{type(e).__name__}: {e}"))


def run_ranks(peer, op, d, world):
    """Seconds from the first rank's start to the last rank's end, and the
    CPU seconds of all ranks (user + system)."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(world, timeout=600)
    procs, conns = [], []
    for r in range(world):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=rank_main, args=(peer, op, d, r, world, barrier, child))
        p.start()
        child.close()  # so that a rank that dies is an EOFError here, not a hang
        procs.append(p)
        conns.append(parent)
    try:
        results = [c.recv() for c in conns]
    except EOFError:
        for p in procs:
            p.kill()
        raise RuntimeError(f"{peer} {op} on {world} ranks: a rank died "
                           f"(exit codes {[p.join() or p.exitcode for p in procs]})")
    for p in procs:
        p.join()
    errors = [r[3] for r in results if r[3]]
    if errors:
        raise RuntimeError(f"{peer} {op} on {world} ranks: {errors[0]}")
    wall = max(r[1] for r in results) - min(r[0] for r in results)
    return wall, sum(r[2] for r in results)


def read_inputs(path):
    with open(path + ".json") as f:
        meta = json.load(f)
    if meta["dtype"] != "float32" or meta["byte_order"] != "little":
        raise SystemExit(f"{path}.json: expected little-endian float32")
    shape = tuple(meta["shape"])
    n = meta["tensors"]
    # np.fromfile reads into a fresh array: anonymous memory of this process.
    flat = np.fromfile(path, dtype="<f4")
    if flat.size != n * shape[0] * shape[1]:
        raise SystemExit(f"{path}: {flat.nbytes} bytes, {path}.json describes {n} x {shape}")
    arrays = flat.reshape((n,) + shape)
    return [(name, arrays[i]) for i, name in enumerate(meta["names"])]


def main():
    global TENSORS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inputs", required=True, help="raw tensors from ckpt-bench-io --dump-inputs")
    ap.add_argument("--dir", required=True, help="where the peers write (removed afterwards)")
    ap.add_argument("--ranks", default="1,4", help="comma-separated rank counts")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--evict", action="store_true", help="drop the files' cached pages before loads")
    args = ap.parse_args()

    TENSORS = read_inputs(args.inputs)
    nbytes = sum(a.nbytes for _, a in TENSORS)
    ranks = [int(x) for x in args.ranks.split(",") if x]
    out = {"bytes": nbytes, "repeats": args.repeats, "evict": args.evict, "dir": args.dir,
           "peers": {}, "skipped": {}, "versions": {}}
    peers = [p for p in args.peers.split(",") if p]
    for peer in peers:
        if peer not in SAVE:
            raise SystemExit(f"unknown peer '{peer}'")
        why = available(peer)
        if why:
            out["skipped"][peer] = why
            print(f"{peer}: skipped ({why})", flush=True)
            continue
        mod = __import__(peer)
        out["versions"][peer] = getattr(mod, "__version__", "?")
        out["peers"][peer] = {str(r): {k: [] for k in ("save_GBps", "load_GBps", "save_cpu_s_per_GB",
                                                        "load_cpu_s_per_GB")} for r in ranks}
    out["versions"]["python"] = sys.version.split()[0]

    for rep in range(args.repeats):
        line = [f"run {rep + 1}:"]
        for peer in list(out["peers"]):
            for r in ranks:
                d = os.path.join(args.dir, f"{peer}-{r}")
                shutil.rmtree(d, ignore_errors=True)
                os.makedirs(d)
                try:
                    save_s = run_ranks(peer, "save", d, r)
                    if args.evict:
                        evict(d)
                    load_s = run_ranks(peer, "load", d, r)
                except Exception as e:  # a failing peer is reported, not measured
                    out["skipped"][peer] = f"failed: {e}"
                    del out["peers"][peer]
                    print(f"{peer}: failed ({e})", flush=True)
                    shutil.rmtree(d, ignore_errors=True)
                    break
                shutil.rmtree(d)
                fig = out["peers"][peer][str(r)]
                gb = nbytes / 1e9
                fig["save_GBps"].append(round(gb / save_s[0], 4))
                fig["load_GBps"].append(round(gb / load_s[0], 4))
                fig["save_cpu_s_per_GB"].append(round(save_s[1] / gb, 4))
                fig["load_cpu_s_per_GB"].append(round(load_s[1] / gb, 4))
                line.append(f"{peer} x{r} save {fig['save_GBps'][-1]:.2f} "
                            f"load {fig['load_GBps'][-1]:.2f};")
        print(" ".join(line), flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
