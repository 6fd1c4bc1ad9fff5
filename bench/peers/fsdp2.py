#!/usr/bin/env python3
"""ckpt.torch next to torch.distributed.checkpoint on one FSDP2 state.

    PYTHONPATH=build/python .venv/bin/python bench/peers/fsdp2.py \
        [--ranks 2] [--layers 8] [--hidden 1024] [--runs 3] [--dir /dev/shm/ckpt-fsdp2]

A stack of Linear(hidden, hidden) blocks, each fully_shard-ed, plus AdamW
state after one step (parameters and two moments: about 12 * layers *
hidden^2 bytes), on --ranks gloo processes. Each run, interleaved, times:
  ckpt.torch  Checkpointer.save / Checkpointer.load ({"model", "optim"} as
              Stateful values; every block checksummed)
  dcp         dcp.save / dcp.load with FileSystemWriter / FileSystemReader
              (DCP's defaults: one file per rank, no checksums)
  dcp+ckpt    dcp.save / dcp.load with ckpt.torch.dcp.Writer / Reader
Every load is checked bit for bit against the saved state after its timing.
Times are the slowest rank's, medians over --runs with the range; the last
line is one JSON object. Not a test: the figures depend on the machine.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

import ckpt.torch as ct
import ckpt.torch.dcp as ckpt_dcp


def build(args):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(args.hidden, args.hidden)
                                  for _ in range(args.layers)])
    for block in model:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, args.hidden)).sum().backward()
    opt.step()
    return model, opt


def snapshot(model, opt):
    msd, osd = get_state_dict(model, opt)
    flat = {}

    def walk(prefix, v):
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}.{k}", x)
        elif isinstance(v, torch.Tensor):
            t = v.to_local() if hasattr(v, "to_local") else v
            flat[prefix] = t.detach().clone()
    walk("model", msd)
    walk("optim", osd)
    return flat


def scramble(model, opt):
    with torch.no_grad():
        for p in model.parameters():
            p.to_local().zero_()
        for st in opt.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    (v.to_local() if hasattr(v, "to_local") else v).zero_()


def timed(fn):
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dist.barrier()
    took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return float(took)


def contenders(model, opt, root, checkpointer):
    def ckpt_save(step):
        checkpointer.save({"model": model, "optim": opt}, step)

    def ckpt_load(step):
        ct.load({"model": model, "optim": opt}, os.path.join(root, "ckpt"), step=step)

    def dcp_save(step, writer):
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, storage_writer=writer(step))

    def dcp_load(step, reader):
        msd, osd = get_state_dict(model, opt)
        sd = {"model": msd, "optim": osd}
        dcp.load(sd, storage_reader=reader(step))
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])

    fs = lambda step: os.path.join(root, "dcp", f"step-{step}")  # noqa: E731
    return {
        "ckpt.torch": (ckpt_save, ckpt_load),
        "dcp": (lambda s: dcp_save(s, lambda s: dcp.FileSystemWriter(fs(s))),
                lambda s: dcp_load(s, lambda s: dcp.FileSystemReader(fs(s)))),
        "dcp+ckpt": (lambda s: dcp_save(s, lambda s: ckpt_dcp.Writer(
                         os.path.join(root, "dcpckpt"), step=s)),
                     lambda s: dcp_load(s, lambda s: ckpt_dcp.Reader(
                         os.path.join(root, "dcpckpt", f"step-{s:08d}")))),
    }


def worker(rank, args, init):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=args.ranks)
    model, opt = build(args)
    expected = snapshot(model, opt)
    times = {}
    # One Checkpointer for the run, as a trainer keeps one (its Writer, staging
    # memory and plan cache are made by the first save).
    checkpointer = ct.Checkpointer(os.path.join(args.dir, "ckpt"))
    for run in range(args.runs):
        for name, (save, load) in contenders(model, opt, args.dir, checkpointer).items():
            t_save = timed(lambda: save(run))
            scramble(model, opt)
            t_load = timed(lambda: load(run))
            got = snapshot(model, opt)
            exact = all(torch.equal(got[k], expected[k]) for k in expected)
            assert exact, f"{name}: the load of run {run} is not bit for bit the saved state"
            times.setdefault(name, {"save": [], "load": []})
            times[name]["save"].append(t_save)
            times[name]["load"].append(t_load)
    checkpointer.close()
    if rank == 0:
        report(args, times, sum(t.numel() * t.element_size() for t in expected.values()))
    dist.barrier()
    dist.destroy_process_group()


def report(args, times, local_bytes):
    size = local_bytes * args.ranks / 2**20
    print(f"FSDP2 state: {args.layers} x Linear({args.hidden}) + AdamW, about {size:.0f} MiB "
          f"on {args.ranks} gloo ranks, {args.dir}, {args.runs} runs (median [min-max], s)")
    out = {"ranks": args.ranks, "mib": round(size, 1), "runs": args.runs, "results": {}}
    for name, t in times.items():
        row = {k: statistics.median(v) for k, v in t.items()}
        print(f"  {name:11s} save {row['save']:.3f} [{min(t['save']):.3f}-{max(t['save']):.3f}]"
              f"  load {row['load']:.3f} [{min(t['load']):.3f}-{max(t['load']):.3f}]")
        out["results"][name] = {"save_s": t["save"], "load_s": t["load"]}
    base = {k: statistics.median(v) for k, v in times["dcp"].items()}
    for name in ("ckpt.torch", "dcp+ckpt"):
        med = {k: statistics.median(v) for k, v in times[name].items()}
        print(f"  {name} vs dcp: save {base['save'] / med['save']:.2f}x as fast, "
              f"load {base['load'] / med['load']:.2f}x as fast")
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dir", default="/dev/shm/ckpt-fsdp2")
    args = p.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            torch.multiprocessing.spawn(worker, args=(args, f"file://{tmp}/store"),
                                        nprocs=args.ranks, join=True)
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
