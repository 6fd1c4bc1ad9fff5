#!/usr/bin/env python3
"""The Python binding's cost: ckpt from Python against the C++ path, and
ckpt.torch against torch.save/torch.load, on the same tensors.

    PYTHONPATH=build/python binding.py --inputs /dev/shm/inputs.bin \
        --dir /dev/shm/binding --bench-io build/bin/ckpt-bench-io --rounds 3

The inputs are the raw float32 tensors of `ckpt-bench-io --dump-inputs`, read
once into this process. One rank, no compression, ckpt's default 4 I/O
threads. Each round runs, back to back on the same bytes:
  C++          ckpt-bench-io --ranks 1 --codecs none (its save: Writer
               creation to commit; its load: a same-layout Load into
               preallocated buffers);
  ckpt         the core binding from Python: Writer.add_tensor of the numpy
               arrays and save; Reader.load into preallocated arrays;
  ckpt.torch   ckpt.torch.save of {name: tensor} (torch.from_numpy: the same
               memory) and ckpt.torch.load into preallocated tensors;
  torch        torch.save to one file + fsync; torch.load (allocates).
Every load is compared with the inputs after its timing. Figures are GB/s
(1e9 bytes) of tensor bytes, medians over rounds. The binding's overhead is
the median time of a Python path over the median time of the C++ path,
minus 1; for ckpt.torch.save it is also measured inside the call: the wall
time of ckpt.torch.save minus the C++ Save's own plan + write + commit time
(SaveResult), which no other process's noise enters.
The last line printed is one JSON object with every figure.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

import ckpt
import ckpt.torch as ct

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import fsync_path, read_inputs  # noqa: E402


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def cpp_path(bench_io, inputs, d):
    p = subprocess.run([bench_io, "--dir", d, "--inputs", inputs, "--repeats", "1",
                        "--ranks", "1", "--codecs", "none"],
                       check=True, capture_output=True, text=True)
    run = json.loads(p.stdout.strip().splitlines()[-1])["ckpt"][0]
    return run["save_GBps"][0], run["load_GBps"][0]


def core_binding(tensors, d):
    def save():
        w = ckpt.Writer()
        for name, a in tensors:
            w.add_tensor(name, ckpt.float32, a.shape, ckpt.Box.full(a.shape), a)
        return w.save(d, 1)
    dst = [np.full(a.shape, -1, a.dtype) for _, a in tensors]
    save_s, _ = timed(save)
    r = ckpt.Reader(d)
    reqs = [ckpt.LoadRequest(name, ckpt.float32, a.shape, None, out)
            for (name, a), out in zip(tensors, dst)]
    load_s, _ = timed(lambda: r.load(reqs))
    return save_s, load_s, dst


def torch_binding(tensors, d):
    state = {name: torch.from_numpy(a) for name, a in tensors}
    dst = {name: torch.full(a.shape, -1.0) for name, a in tensors}
    save_s, result = timed(lambda: ct.save(state, d, 1))
    inner = result.plan_seconds + result.write_seconds + result.commit_seconds
    load_s, _ = timed(lambda: ct.load(dst, d))
    return save_s, inner, load_s, [dst[name].numpy() for name, _ in tensors]


def torch_peer(tensors, d):
    os.makedirs(d)
    path = os.path.join(d, "rank.pt")
    state = {name: torch.from_numpy(a) for name, a in tensors}

    def save():
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        fsync_path(d)
    save_s, _ = timed(save)
    load_s, loaded = timed(lambda: torch.load(path))
    return save_s, load_s, [loaded[name].numpy() for name, _ in tensors]


def check(what, tensors, loaded):
    for (name, a), b in zip(tensors, loaded):
        if not np.array_equal(a, b):
            raise SystemExit(f"{what}: '{name}' loaded wrong")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--dir", required=True, help="scratch directory (removed)")
    ap.add_argument("--bench-io", required=True, help="the ckpt-bench-io program")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tensors = read_inputs(args.inputs)
    gb = sum(a.nbytes for _, a in tensors) / 1e9
    t = {k: [] for k in ("cpp_save", "cpp_load", "ckpt_save", "ckpt_load", "ckpt.torch_save",
                         "ckpt.torch_load", "ckpt.torch_save_in_cpp", "torch_save",
                         "torch_load")}
    for k in range(args.rounds):
        shutil.rmtree(args.dir, ignore_errors=True)
        os.makedirs(args.dir)
        s, l = cpp_path(args.bench_io, args.inputs, os.path.join(args.dir, "cpp"))
        t["cpp_save"].append(gb / s)  # seconds from GB/s
        t["cpp_load"].append(gb / l)
        s, l, out = core_binding(tensors, os.path.join(args.dir, "core"))
        check("ckpt", tensors, out)
        t["ckpt_save"].append(s)
        t["ckpt_load"].append(l)
        s, inner, l, out = torch_binding(tensors, os.path.join(args.dir, "ckpt.torch"))
        check("ckpt.torch", tensors, out)
        t["ckpt.torch_save"].append(s)
        t["ckpt.torch_save_in_cpp"].append(inner)
        t["ckpt.torch_load"].append(l)
        s, l, out = torch_peer(tensors, os.path.join(args.dir, "torch"))
        check("torch", tensors, out)
        t["torch_save"].append(s)
        t["torch_load"].append(l)
        print(f"round {k + 1}/{args.rounds} done", flush=True)
    shutil.rmtree(args.dir, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in t.items()}
    rows = []
    for who in ("cpp", "ckpt", "ckpt.torch", "torch"):
        row = {"who": {"cpp": "C++ (ckpt-bench-io)", "ckpt": "ckpt (core binding)",
                       "ckpt.torch": "ckpt.torch", "torch": "torch.save/load"}[who]}
        for op in ("save", "load"):
            row[f"{op}_s"] = med[f"{who}_{op}"]
            row[f"{op}_GBps"] = gb / med[f"{who}_{op}"]
            row[f"{op}_vs_cpp"] = med[f"{who}_{op}"] / med[f"cpp_{op}"] - 1
        rows.append(row)
    in_call = statistics.median(
        (w - i) / i for w, i in zip(t["ckpt.torch_save"], t["ckpt.torch_save_in_cpp"]))
    print(f"{gb:.3f} GB of float32 tensors, 1 rank, no compression, median of {args.rounds} rounds")
    print(f"{'':22} {'save GB/s':>10} {'vs C++':>8} {'load GB/s':>10} {'vs C++':>8}")
    for r in rows:
        print(f"{r['who']:22} {r['save_GBps']:10.3f} {r['save_vs_cpp']:+8.1%} "
              f"{r['load_GBps']:10.3f} {r['load_vs_cpp']:+8.1%}")
    print(f"ckpt.torch.save in-call overhead (wall - C++ Save's own time): {in_call:+.2%}")
    print(json.dumps({"gb": gb, "rounds": args.rounds, "rows": rows,
                      "torch_save_in_call_overhead": in_call,
                      "times_s": t, "torch": torch.__version__, "ckpt": ckpt.__version__}))


if __name__ == "__main__":
    main()
