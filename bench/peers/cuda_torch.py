"""ckpt.torch against torch.distributed.checkpoint on one GPU (issue 25).

    python3 bench/peers/cuda_torch.py [--gib 4] [--dir D] [--runs 3] [--device cuda]

One process, no process group: the bench/peers/torch_state.py model
(bf16 attention/MLP weights, fp32 embedding/head/norms) on the device with
its AdamW state after one optimizer step, about --gib GiB of CUDA tensors
(plus each parameter's fp32 `step` on the CPU, as AdamW keeps it). Every
contender runs once per run, interleaved, --runs runs; medians and ranges.

  limits   pinned D2H: one copy of each tensor into pinned host memory
           allocated before (non_blocking, then synchronize; best of 2);
           D2D: the same into device memory
  sync     dcp.save (FileSystemWriter, thread_count 1 and 8) and
           ckpt.torch.save
  async    blocked = from the call until the state may be modified (the
           call's return, and DCP's staging_completion where it has one);
           durable = until the checkpoint is committed. After the call
           returns every tensor is overwritten on the device (the training
           step); once durable the checkpoint is loaded (untimed) and
           compared bit for bit with the state at the call. For ckpt
           also its C++ call (SaveResult.stall_seconds; the rest of
           blocked is the Python of the call) and that call's snapshot
           (SaveResult.snapshot_seconds; the rest of the call is the plan
           and the step's directory).
           dcp.async          dcp.async_save, its default stager
           dcp.async pinned   DefaultStager(StagingOptions(use_pinned_memory,
                              use_async_staging, use_non_blocking_copy; no
                              shared memory)), kept across saves: DCP's
                              documented stager for CUDA state
           dcp.async cached   BlockingAsyncStager(cache_staged_state_dict=
                              True), kept across saves
           ckpt async         ckpt.torch.save_async (pinned host staging)
           ckpt async device  ckpt.torch.save_async(snapshot_to_device=True)
  load     into the state's own tensors, after they were overwritten:
           dcp.load and ckpt.torch.load, each checked bit for bit.

Prints one line per figure, `target` lines (ckpt's blocked time <= 0.8x
the best DCP async contender's), and the JSON object last. --device cpu
runs the same on the CPU (a smoke test of this script; DCP's two stagers
that pin memory and the device snapshot are then skipped).
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import time

import torch
import torch.distributed.checkpoint as dcp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_state as ts  # noqa: E402

import ckpt  # noqa: E402
import ckpt.torch as ct  # noqa: E402


def build_state(gib: float, device: str):
    hidden, layers = ts.dims(gib)
    model = ts.Model(hidden, layers).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e-3)
    opt.step()
    opt.zero_grad(set_to_none=True)
    g = torch.Generator(device=device).manual_seed(25)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, device=device, dtype=torch.float32))
    names = {p: n for n, p in model.named_parameters()}
    optim = {names[p]: dict(s) for p, s in opt.state.items()}
    return {"model": dict(model.state_dict()), "optim": {"state": optim}, "step": 1}, hidden, layers


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def overwrite(sd):
    """The training step after an async save's call: every tensor changes."""
    with torch.no_grad():
        for _, t in ts.leaves(sd):
            t.add_(1)


def check(sd, ref, what):
    sync(ref[next(iter(ref))].device.type)
    bad = ts.differences(sd, ref)
    if bad:
        raise AssertionError(f"{what}: {len(bad)} tensors differ from the saved state ({bad[:3]})")


class Bench:
    def __init__(self, args):
        self.args, self.dev = args, args.device
        self.sd, self.hidden, self.layers = build_state(args.gib, self.dev)
        self.ref = ts.snapshot(self.sd)
        self.cuda_bytes = sum(t.numel() * t.element_size() for _, t in ts.leaves(self.sd)
                              if t.device.type == self.dev)
        self.root = args.dir
        shutil.rmtree(self.root, ignore_errors=True)
        os.makedirs(self.root)
        self.stagers = {}
        self.failed = {}
        self.pinned = self.devcopy = None

    def path(self, name, s):
        return os.path.join(self.root, name.replace(" ", "_"), f"step-{s:08d}")

    def ckroot(self, name):
        return os.path.join(self.root, name.replace(" ", "_"))

    # -- limits --

    def limit(self, to_device: bool) -> float:
        tensors = [t for _, t in ts.leaves(self.sd) if t.device.type == self.dev]
        if to_device:
            if self.devcopy is None:
                self.devcopy = [torch.empty_like(t) for t in tensors]
            dst = self.devcopy
        else:
            if self.pinned is None:
                pin = self.dev == "cuda"
                self.pinned = [torch.empty(t.shape, dtype=t.dtype, pin_memory=pin) for t in tensors]
                for p in self.pinned:
                    p.zero_()
            dst = self.pinned
        best = float("inf")
        for _ in range(2):
            sync(self.dev)
            t0 = time.perf_counter()
            for d, s in zip(dst, tensors):
                d.copy_(s, non_blocking=True)
            sync(self.dev)
            best = min(best, time.perf_counter() - t0)
        return best

    # -- contenders --

    def dcp_save(self, threads):
        def run(s):
            dcp.save(self.sd, storage_writer=dcp.FileSystemWriter(self.path(f"dcp t{threads}", s),
                                                                  thread_count=threads),
                     no_dist=True)
        return run

    def stager(self, kind):
        from torch.distributed.checkpoint.staging import (BlockingAsyncStager, DefaultStager,
                                                          StagingOptions)
        if kind not in self.stagers:
            self.stagers[kind] = (
                BlockingAsyncStager(cache_staged_state_dict=True) if kind == "cached"
                else DefaultStager(StagingOptions(use_pinned_memory=True, use_shared_memory=False,
                                                  use_async_staging=True, use_non_blocking_copy=True)))
        return self.stagers[kind]

    def dcp_async(self, kind):
        def start(s):
            extra = {} if kind == "default" else {"async_stager": self.stager(kind)}
            return dcp.async_save(self.sd, storage_writer=dcp.FileSystemWriter(
                self.path(f"dcp async {kind}", s)), no_dist=True, **extra)
        return start

    def dcp_verify(self, kind):
        def verify(s):
            dcp.load(self.sd, storage_reader=dcp.FileSystemReader(self.path(f"dcp async {kind}", s)),
                     no_dist=True)
        return verify

    def async_contenders(self):
        out = {"dcp.async": (self.dcp_async("default"), self.dcp_verify("default"))}
        if self.dev == "cuda":
            out["dcp.async pinned"] = (self.dcp_async("pinned"), self.dcp_verify("pinned"))
            out["dcp.async cached"] = (self.dcp_async("cached"), self.dcp_verify("cached"))
        out["ckpt async"] = (lambda s: ct.save_async(self.sd, self.ckroot("ckpt async"), s),
                             lambda s: ct.load(self.sd, self.ckroot("ckpt async"), step=s))
        if self.dev == "cuda":
            out["ckpt async device"] = (
                lambda s: ct.save_async(self.sd, self.ckroot("ckpt async device"), s,
                                        snapshot_to_device=True),
                lambda s: ct.load(self.sd, self.ckroot("ckpt async device"), step=s))
        return out

    def run_async(self, start, verify, s, what):
        sync(self.dev)
        t0 = time.perf_counter()
        h = start(s)
        if hasattr(h, "staging_completion"):
            h.staging_completion.result()
        blocked = time.perf_counter() - t0
        overwrite(self.sd)
        result = None
        if hasattr(h, "upload_completion"):
            h.upload_completion.result()
        elif hasattr(h, "wait"):
            result = h.wait()  # ckpt's SaveResult
        else:
            h.result()
        durable = time.perf_counter() - t0
        verify(s)
        check(self.sd, self.ref, what)
        return blocked, durable, result

    def restore(self):
        with torch.no_grad():
            for name, t in ts.leaves(self.sd):
                t.copy_(self.ref[name])

    def timed(self, fn):
        sync(self.dev)
        t0 = time.perf_counter()
        fn()
        sync(self.dev)
        return time.perf_counter() - t0

    def one_run(self, s, res):
        add = lambda k, v: res.setdefault(k, []).append(v)  # noqa: E731
        add("limit pinned D2H", self.limit(False))
        if self.dev == "cuda":
            add("limit D2D", self.limit(True))
        for threads in (1, 8):
            add(f"save dcp.save t{threads}", self.timed(lambda: self.dcp_save(threads)(s)))
        add("save ckpt.torch.save", self.timed(lambda: ct.save(self.sd, self.ckroot("ckpt"), s)))
        for name, (start, verify) in self.async_contenders().items():
            if name in self.failed:
                continue
            try:
                b, d, r = self.run_async(start, verify, s, name)
            except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
                self.failed[name] = f"{type(e).__name__}: {e}"
                self.restore()  # the state at the call, for the next contender
                print(f"{name}: failed in run {s - 99}, not run again: {self.failed[name]}", flush=True)
                continue
            add(f"blocked {name}", b)
            add(f"durable {name}", d)
            if r is not None:
                add(f"blocked {name}: C++ stall", r.stall_seconds)
                add(f"blocked {name}: C++ snapshot", r.snapshot_seconds)
            print(f"  {name}: blocked {b:.3f} s, durable {d:.3f} s"
                  + (f" (C++ stall {r.stall_seconds:.4f} s, its snapshot "
                     f"{r.snapshot_seconds:.4f} s)" if r is not None else ""), flush=True)
        for name, fn in (("dcp.load", lambda: dcp.load(self.sd, storage_reader=dcp.FileSystemReader(
                              self.path("dcp t8", s)), no_dist=True)),
                         ("ckpt.torch.load", lambda: ct.load(self.sd, self.ckroot("ckpt"), step=s))):
            ts.scramble(self.sd)
            add(f"load {name}", self.timed(fn))
            check(self.sd, self.ref, name)
        for d in os.listdir(self.root):  # keep /dev/shm small: this run's checkpoints go
            shutil.rmtree(os.path.join(self.root, d), ignore_errors=True)


def summarize(res, b: Bench):
    med = {k: statistics.median(v) for k, v in res.items()}
    gib = b.cuda_bytes / 2**30
    for k, v in res.items():
        rate = f"  ({b.cuda_bytes / med[k] / 1e9:.2f} GB/s)" if not k.startswith("blocked") else ""
        print(f"{k:32s} median {med[k]:.3f} s  range {min(v):.3f}-{max(v):.3f} s{rate}")
    dcp_async = [k for k in med if k.startswith("blocked dcp.async")]
    best_dcp = min(dcp_async, key=lambda k: med[k])
    targets = {}

    def target(name, got, limit, better="<="):
        met = got <= limit if better == "<=" else got >= limit
        targets[name] = {"value": round(got, 4), "target": f"{better} {limit}", "met": met}
        print(f"target {name}: {got:.3f} (target {better} {limit}): {'met' if met else 'MISSED'}")

    for ck in ("blocked ckpt async", "blocked ckpt async device"):
        if ck in med:
            target(f"{ck[8:]} blocked / {best_dcp[8:]}", med[ck] / med[best_dcp], 0.8)
    best_dcp_durable = min((k for k in med if k.startswith("durable dcp.async")), key=lambda k: med[k])
    for ck in ("durable ckpt async", "durable ckpt async device"):
        if ck in med:
            print(f"ratio {ck[8:]} durable / {best_dcp_durable[8:]}: "
                  f"{med[ck] / med[best_dcp_durable]:.3f}")
    best_save = min((k for k in med if k.startswith("save dcp")), key=lambda k: med[k])
    print(f"ratio ckpt.torch.save throughput / {best_save[5:]}: "
          f"{med[best_save] / med['save ckpt.torch.save']:.3f}")
    print(f"ratio ckpt.torch.load throughput / dcp.load: "
          f"{med['load dcp.load'] / med['load ckpt.torch.load']:.3f}")
    out = {"bench": "cuda_torch", "device": torch.cuda.get_device_name() if b.dev == "cuda" else "cpu",
           "torch": torch.__version__, "state_bytes": b.cuda_bytes, "state_gib": round(gib, 3),
           "model": ts.describe(b.hidden, b.layers), "runs": b.args.runs, "dir": b.root,
           "median_s": {k: round(v, 4) for k, v in med.items()},
           "range_s": {k: [round(min(v), 4), round(max(v), 4)] for k, v in res.items()},
           "failed": b.failed, "targets": targets}
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=4.0)
    p.add_argument("--dir", default="/dev/shm/ckpt-cuda-torch")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--warmup", type=int, default=1, choices=(0, 1),
                   help="one untimed run first (staging memory allocated, as in training)")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("skipped: torch has no CUDA device")
        return 0
    if args.device == "cuda" and not ckpt._ckpt.has_cuda:
        print("skipped: ckpt was built without CUDA support (ckpt_gpu)")
        return 0
    b = Bench(args)
    print(f"state: {ts.describe(b.hidden, b.layers)}, {b.cuda_bytes / 2**30:.2f} GiB on {args.device}; "
          f"torch {torch.__version__}; {args.dir}", flush=True)
    res = {}
    if args.warmup:  # the first save of each allocates its staging (pinned, device) memory
        t0 = time.perf_counter()
        b.one_run(99, {})
        print(f"warm-up run (not counted): {time.perf_counter() - t0:.1f} s", flush=True)
    for r in range(args.runs):
        t0 = time.perf_counter()
        b.one_run(100 + r, res)
        print(f"run {r + 1} of {args.runs}: {time.perf_counter() - t0:.1f} s", flush=True)
    summarize(res, b)
    ct.release()
    shutil.rmtree(args.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
