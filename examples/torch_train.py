#!/usr/bin/env python3
"""A small PyTorch training job that checkpoints through ckpt.torch.

    PYTHONPATH=build/python /usr/bin/python3 examples/torch_train.py \
        --world-size 2 --steps 6 --save-every 3 --root /tmp/run

Trains a tiny transformer language model on synthetic tokens with DDP and
Adam (or ZeroRedundancyOptimizer with --zero) on N processes
(torch.multiprocessing.spawn, gloo), saving every K steps. When ROOT already
holds a checkpoint it resumes from `latest`, on any world size: the model
and the optimizer state are resharded, each rank gets its own saved RNG
and data position back (a rank that did not exist then starts its own).
"""
import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

import ckpt
import ckpt.torch as ct

VOCAB, SEQ, BATCH, DIM = 256, 32, 8, 64


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.Sequential(*[
            torch.nn.TransformerEncoderLayer(DIM, nhead=4, dim_feedforward=4 * DIM,
                                             dropout=0.0, batch_first=True)
            for _ in range(2)])
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        return self.head(self.blocks(self.embed(tokens)))


def train(rank, args, store, resume):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=args.world_size)
    torch.manual_seed(0)
    model = DistributedDataParallel(TinyLM())
    if args.zero:
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                      lr=1e-3)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(1000 + rank)
    state = {"model": model.state_dict(),
             "optim": ct.optimizer_state_dict(model, opt),
             "rng": ct.PerRank(torch.get_rng_state()),
             "data": {"rng": ct.PerRank(data.get_state()), "position": ct.PerRank(0)},
             "step": 0}
    log = print if rank == 0 else (lambda *a, **k: None)

    if resume:
        t0 = time.perf_counter()
        report = ct.load(state, args.root)
        ct.set_optimizer_state_dict(model, opt, state["optim"])
        torch.set_rng_state(state["rng"].value)
        data.set_state(state["data"]["rng"].value)
        saved_on = ckpt.Reader(args.root).world_size
        log(f"resumed from step {state['step']} of {args.root} (saved on {saved_on} ranks, "
            f"loading on {args.world_size}): {len(report.loaded)} entries, "
            f"{report.bytes_loaded / 2**20:.1f} MiB in {time.perf_counter() - t0:.2f} s")
        for name, why in report.not_loaded:
            log(f"  not loaded: {name}: {why}")

    while state["step"] < args.steps:
        tokens = torch.randint(VOCAB, (BATCH, SEQ + 1), generator=data)
        loss = F.cross_entropy(model(tokens[:, :-1]).reshape(-1, VOCAB),
                               tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        state["step"] += 1
        state["data"]["position"] = ct.PerRank(state["data"]["position"].value + 1)
        log(f"step {state['step']:4d}  loss {loss.item():.4f}")
        if state["step"] % args.save_every == 0 or state["step"] == args.steps:
            state["rng"] = ct.PerRank(torch.get_rng_state())
            state["data"]["rng"] = ct.PerRank(data.get_state())
            t0 = time.perf_counter()
            result = ct.save(state, args.root, state["step"], overwrite=True, keep_last=2)
            log(f"saved step {state['step']} -> {result.path} "
                f"({result.stored_bytes / 2**20:.1f} MiB, {time.perf_counter() - t0:.2f} s)")
    finish()


def finish():
    """Ends this rank. os._exit skips the interpreter's teardown: with torch
    1.13, destroying DDP's reducer and the gloo process group at exit can
    deadlock (a gloo thread frees a tensor and waits for the GIL that the
    exiting thread holds while it joins that thread)."""
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=2, help="processes (ranks)")
    p.add_argument("--steps", type=int, default=6, help="train until this step")
    p.add_argument("--save-every", type=int, default=3, help="save every K steps")
    p.add_argument("--root", required=True, help="checkpoint root (resumes from latest)")
    p.add_argument("--zero", action="store_true", help="ZeroRedundancyOptimizer(Adam)")
    args = p.parse_args()
    os.makedirs(args.root, exist_ok=True)
    # Decided once, before any rank runs: a rank that looked later could
    # see the checkpoint another rank has just written.
    resume = os.path.exists(os.path.join(args.root, "latest"))
    with tempfile.TemporaryDirectory() as tmp:
        torch.multiprocessing.spawn(train, args=(args, os.path.join(tmp, "store"), resume),
                                    nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
