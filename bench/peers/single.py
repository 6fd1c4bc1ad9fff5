#!/usr/bin/env python3
"""ckpt next to safetensors in one process, and ckpt-convert next to DCP's
consolidation to Hugging Face safetensors.

    PYTHONPATH=build/python .venv/bin/python bench/peers/single.py \
        --gib 1 --runs 3 --shm-dir /dev/shm/ckpt-single --disk-dir build/bench/work/single \
        [--consolidate KEEPDIR --bin build/bin] [--integrity]

safetensors: the state of torch_state.py (model and AdamW state, bf16 and
fp32) as one flat dict of plain tensors in this process. Each run, in an
order that rotates run by run:
  save   safetensors.torch.save_file + fsync of the file and its directory
         (durability paid by both: ckpt fsyncs its files and directories),
         ckpt.torch.save (one process, every block checksummed);
  limit  one write(2) of each tensor's bytes into one file + fsync, and
         readinto(2) of them in place: the bound of any format;
  load   into the tensors of a state dict (allocated and written once before,
         as a model's parameters are): safetensors.torch.load_file and a
         copy_ into them (load_file alone maps the file: its tensors' pages
         are read at their first use, here the copy), ckpt.torch.load (in
         place).
On --shm-dir (tmpfs) only warm loads exist (the files are memory). On
--disk-dir each file's cached pages are dropped with posix_fadvise
(POSIX_FADV_DONTNEED, after the save's fsync) before a cold load; a warm
load follows it. Every load is compared bit for bit with the state after
its timing.

--consolidate KEEPDIR (fsdp2.py same --keep, saved on several processes):
the model's state, saved by dcp.save with HuggingFaceStorageWriter(
save_distributed=True) and by ckpt.torch.save, turned into one Hugging
Face safetensors file:
  dcp consolidate T  torch.distributed.checkpoint._consolidate_hf_safetensors.
                     consolidate_safetensors_files(num_threads=T), T = 1
                     (its default) and 2, + fsync of what it wrote
  ckpt-convert       ckpt-convert --to safetensors (fsyncs its output)
  limit              write(2) of as many bytes from memory (4 MiB pieces of
                     one buffer) into one new file + fsync: the cost of
                     writing the output alone
  limit: copy        the input's bytes (ckpt's shard files) read with
                     pread(2) on one thread and appended to one new file
                     with write(2) on another, 4 MiB at a time through
                     three buffers, + fsync: reading the input and writing
                     the output, which any consolidation does, with no
                     format and no checksum. (The kernel's own copy,
                     copy_file_range(2), and write(2) straight from a
                     mapping of the input were slower on tmpfs.)
each output checked bit for bit (safetensors.torch.load_file) untimed.

--integrity: a safetensors file and a ckpt checkpoint of the state, one byte
in the middle of the stored bytes of one tensor flipped, then loaded.

Figures are seconds, medians over --runs with the range, and the CPU
seconds (user + system) of each ("cpu" next to the figures; ckpt-convert's
as a waited-for child). The last line is
one JSON object.
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

import torch

import ckpt.torch as ct

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_state as ts  # noqa: E402

TARGET = "model.layers.0.up.weight"


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def evict(path):
    paths = [path] if os.path.isfile(path) else [
        os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(ts.bits(a), ts.bits(b))


def wrong(got, want):
    return sorted(k for k in want if k not in got or not same_bits(got[k], want[k]))


# ---- safetensors and ckpt on one process ----------------------------------------


def st_save(sd, path):
    from safetensors.torch import save_file
    save_file(sd, path)
    fsync_path(path)
    fsync_path(os.path.dirname(path))


def st_load(path, dst):
    from safetensors.torch import load_file
    with torch.no_grad():
        for k, t in load_file(path).items():
            dst[k].copy_(t)
    return dst


def ckpt_save(sd, root):
    ct.save(sd, root, 1)


def ckpt_load(root, dst):
    ct.load(dst, root, step=1)
    return dst


def destination(sd):
    """Tensors like sd's, their pages written once (a model's parameters)."""
    return {k: torch.full(v.shape, -7.0, dtype=v.dtype) for k, v in sd.items()}


def scramble(dst):
    for t in dst.values():
        t.fill_(-7.0)


def raw_save(sd, path):
    """The bound of any save: one write(2) of each tensor's bytes into one
    file, fsync'd (no format, no checksum)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for t in sd.values():
            os.write(fd, memoryview(ts.bits(t).numpy()))
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_path(os.path.dirname(path))


def raw_load(path, dst):
    """The bound of any load: readinto(2) of each tensor's bytes, in place."""
    with open(path, "rb", buffering=0) as f:
        for t in dst.values():
            view = memoryview(ts.bits(t).numpy())
            n = 0
            while n < len(view):
                n += f.readinto(view[n:])
    return dst


def cpu_now():
    """CPU seconds (user + system) of this process's threads and its waited
    for children (ckpt-convert)."""
    u, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime + c.ru_utime + c.ru_stime


CPU = {}  # the CPU seconds of the last timed() call


def timed(fn):
    c0 = cpu_now()
    t0 = time.perf_counter()
    out = fn()
    CPU["last"] = cpu_now() - c0
    return time.perf_counter() - t0, out


def single(args, sd, say):
    out = {}
    locs = [("shm", args.shm_dir)] + ([("disk", args.disk_dir)] if args.disk_dir else [])
    contenders = {
        "limit": (lambda d: os.path.join(d, "state.bin"), raw_save, raw_load),
        "safetensors": (lambda d: os.path.join(d, "state.safetensors"), st_save, st_load),
        "ckpt.torch": (lambda d: os.path.join(d, "ckpt"), ckpt_save, ckpt_load),
    }
    dst = destination(sd)
    for loc, d in locs:
        res = out[loc] = {"dir": d}
        for run in range(args.runs):
            names = list(contenders)
            k = run % len(names)
            names = names[k:] + names[:k]
            line = [f"{loc} run {run + 1}/{args.runs}:"]
            paths = {}
            for name in names:
                where, save, _ = contenders[name]
                shutil.rmtree(os.path.join(d, name), ignore_errors=True)
                os.makedirs(os.path.join(d, name))
                paths[name] = where(os.path.join(d, name))
                t, _ = timed(lambda: save(sd, paths[name]))
                res.setdefault(name, {}).setdefault("save_s", []).append(t)
                res.setdefault("cpu", {}).setdefault(name, {}).setdefault("save_s", []).append(
                    CPU["last"])
                line.append(f"{name} save {t:.2f}")
            kinds = ["cold", "warm"] if loc == "disk" else ["warm"]
            for kind in kinds:
                for name in names:
                    _, _, load = contenders[name]
                    if kind == "cold":
                        evict(paths[name])
                    scramble(dst)
                    t, got = timed(lambda: load(paths[name], dst))
                    bad = wrong(got, sd)
                    if bad:
                        raise AssertionError(f"{name} {kind} load of run {run}: {len(bad)} tensors "
                                             f"differ ({bad[:3]})")
                    res[name].setdefault(f"load_{kind}_s", []).append(t)
                    res["cpu"][name].setdefault(f"load_{kind}_s", []).append(CPU["last"])
                    line.append(f"{name} {kind} {t:.2f}")
            for name in names:
                shutil.rmtree(os.path.join(d, name))
            say(" ".join(line))
    return out


# ---- consolidation ---------------------------------------------------------------


def pipelined_copy(inputs, out, piece=4 << 20, buffers=3):
    """The bytes of the files `inputs`, in order, appended to the new file
    `out` (fsynced): pread(2) on this thread, write(2) on another, through
    `buffers` buffers of `piece` bytes (both calls release the GIL)."""
    import queue
    import threading
    free, full = queue.Queue(), queue.Queue()
    for _ in range(buffers):
        free.put(bytearray(piece))
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    failed = []

    def write_behind():
        try:
            while (item := full.get()) is not None:
                buf, n = item
                view, done = memoryview(buf), 0
                while done < n:
                    done += os.write(fd, view[done:n])
                free.put(buf)
        except OSError as e:
            failed.append(e)
            free.put(None)

    t = threading.Thread(target=write_behind)
    t.start()
    try:
        for path in inputs:
            src = os.open(path, os.O_RDONLY)
            try:
                at = 0
                while not failed:
                    buf = free.get()
                    if buf is None:
                        break
                    n = os.preadv(src, [buf], at)
                    if n == 0:
                        free.put(buf)
                        break
                    full.put((buf, n))
                    at += n
            finally:
                os.close(src)
    finally:
        full.put(None)
        t.join()
        try:
            if not failed:
                os.fsync(fd)
        finally:
            os.close(fd)
    if failed:
        raise failed[0]


def consolidation(args, say):
    from safetensors.torch import load_file
    from torch.distributed.checkpoint._consolidate_hf_safetensors import (
        consolidate_safetensors_files)
    kept = json.load(open(os.path.join(args.consolidate, "kept.json")))
    model = ts.Model(kept["hidden"], kept["layers"])
    want = {fqn: ts.value(f"model.{fqn}", p.shape, (0,) * p.dim(), p.shape, p.dtype)
            for fqn, p in model.named_parameters()}
    del model
    hf_in = os.path.join(args.consolidate, "hf")
    ck_in = os.path.join(args.consolidate, "ckpt-model", "step-00000001")
    work = os.path.join(args.shm_dir, "consolidated")
    tool = os.path.join(args.bin, "ckpt-convert")

    def dcp_run(threads):
        def run(dst):
            consolidate_safetensors_files(hf_in, dst, {fqn: 1 for fqn in want},
                                          num_threads=threads)
            for f in os.listdir(dst):
                fsync_path(os.path.join(dst, f))
            fsync_path(dst)
        return run

    def ckpt_run(dst):
        subprocess.run([tool, "--to", "safetensors", ck_in, os.path.join(dst, "model.safetensors")],
                       check=True, capture_output=True, text=True)

    model_bytes = sum(t.numel() * t.element_size() for t in want.values())
    piece = memoryview(bytearray(4 << 20))

    def limit_run(dst):
        fd = os.open(os.path.join(dst, "limit.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            left = model_bytes
            while left:
                left -= os.write(fd, piece[:min(left, len(piece))])
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_path(dst)

    inputs = sorted(os.path.join(ck_in, f) for f in os.listdir(ck_in) if f.endswith(".ckpt"))

    def copy_run(dst):
        pipelined_copy(inputs, os.path.join(dst, "copy.bin"))
        fsync_path(dst)

    contenders = {"dcp consolidate": dcp_run(1), "dcp consolidate T=2": dcp_run(2),
                  "ckpt-convert": ckpt_run, "limit": limit_run, "limit: copy": copy_run}
    out = {"from_ranks": kept["ranks"], "model_bytes": model_bytes, "results": {}}
    for run in range(args.runs):
        names = list(contenders)
        k = run % len(names)
        line = [f"consolidation run {run + 1}/{args.runs}:"]
        for name in names[k:] + names[:k]:
            dst = os.path.join(work, name.replace(" ", "_").replace("=", ""))
            shutil.rmtree(dst, ignore_errors=True)
            os.makedirs(dst)
            t, _ = timed(lambda: contenders[name](dst))
            if not name.startswith("limit"):
                got = {}
                for f in os.listdir(dst):
                    if f.endswith(".safetensors"):
                        got.update(load_file(os.path.join(dst, f)))
                bad = wrong(got, want)
                if bad:
                    raise AssertionError(f"{name} run {run}: {len(bad)} tensors differ ({bad[:3]})")
                del got
            shutil.rmtree(dst)
            out["results"].setdefault(name, []).append(t)
            out.setdefault("cpu_s", {}).setdefault(name, []).append(CPU["last"])
            line.append(f"{name} {t:.2f}")
        say(" ".join(line))
    shutil.rmtree(work, ignore_errors=True)
    return out


# ---- integrity ---------------------------------------------------------------------


def flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())


def safetensors_location(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    a, b = header[TARGET]["data_offsets"]
    return 8 + n + (a + b) // 2


def ckpt_location(step_dir, bin_dir):
    doc = json.loads(subprocess.run([os.path.join(bin_dir, "ckpt-inspect"), "--json", "--entry",
                                     TARGET, step_dir], check=True, capture_output=True,
                                    text=True).stdout)
    c = doc["entries"][0]["chunk_map"][0]
    return os.path.join(step_dir, f"shard-{c['shard']:05d}.ckpt"), c["data_offset"] + c["stored_length"] // 2


def integrity(args, sd, say):
    out = {}
    base = os.path.join(args.shm_dir, "integrity")
    os.makedirs(base, exist_ok=True)
    st = os.path.join(base, "state.safetensors")
    ck = os.path.join(base, "ckpt")
    cases = {
        "safetensors": (lambda: st_save(sd, st), lambda: (st, safetensors_location(st)),
                        lambda: st_load(st, dst)),
        "ckpt.torch": (lambda: ckpt_save(sd, ck),
                       lambda: ckpt_location(os.path.join(ck, "step-00000001"), args.bin),
                       lambda: ckpt_load(ck, dst)),
    }
    dst = destination(sd)
    for name, (save, locate, load) in cases.items():
        scramble(dst)
        save()
        file, offset = locate()
        flip(file, offset)
        try:
            got = load()
        except Exception as e:  # what we are after
            msg = f"{type(e).__name__}: {e}"
            named = [w for w in (TARGET, os.path.basename(file)) if w in msg]
            r = {"outcome": "error naming the place" if named else "error without the place",
                 "message": msg[:400], "names": named}
        else:
            bad = wrong(got, sd)
            r = ({"outcome": "loaded wrong values silently", "wrong_tensors": bad} if bad else
                 {"outcome": "loaded correct values (the byte was not read)"})
        r.update(file=os.path.relpath(file, base), offset=offset, tensor=TARGET)
        out[name] = r
        say(f"  integrity {name}: byte {offset} of {r['file']} flipped: {r['outcome']}"
            + (f" ({r['message'][:160]})" if "message" in r else ""))
    shutil.rmtree(base)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--shm-dir", default="/dev/shm/ckpt-single")
    p.add_argument("--disk-dir", help="a directory on a disk (cold loads); none: /dev/shm only")
    p.add_argument("--consolidate", help="a directory of fsdp2.py same --keep")
    p.add_argument("--bin", default="build/bin", help="where ckpt-convert and ckpt-inspect are")
    p.add_argument("--integrity", action="store_true")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch's intra-op threads (its copies); 1 as in fsdp2.py's processes")
    args = p.parse_args()
    torch.set_num_threads(args.torch_threads)

    def say(s):
        print(s, flush=True)

    for d in (args.shm_dir, args.disk_dir):
        if d:
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
    out = {}
    try:
        hidden, layers = ts.dims(args.gib)
        sd = ts.full_state(hidden, layers)
        out["state_bytes"] = sum(t.numel() * t.element_size() for t in sd.values())
        out["tensors"] = len(sd)
        say(f"one process: {ts.describe(hidden, layers)}, {ts.fmt_gib(out['state_bytes'])} "
            f"in {len(sd)} tensors")
        import safetensors
        out["versions"] = {"torch": torch.__version__, "safetensors": safetensors.__version__}
        out["single"] = single(args, sd, say)
        if args.integrity:
            out["integrity"] = integrity(args, sd, say)
        del sd
        if args.consolidate:
            out["consolidation"] = consolidation(args, say)
    finally:
        for d in (args.shm_dir, args.disk_dir):
            if d:
                shutil.rmtree(d, ignore_errors=True)

    def s(v):
        return f"{statistics.median(v):.3f} [{min(v):.3f}-{max(v):.3f}]"
    for loc, res in out["single"].items():
        for name, r in res.items():
            if name not in ("dir", "cpu"):
                say(f"  {loc} {name:12s} " + "  ".join(f"{k[:-2]} {s(v)}" for k, v in r.items()))
    for name, v in out.get("consolidation", {}).get("results", {}).items():
        say(f"  consolidation {name:20s} {s(v)}")
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
