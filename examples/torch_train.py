#!/usr/bin/env python3
"""A small PyTorch training job that checkpoints through ckpt.torch.

    PYTHONPATH=build/python .venv/bin/torchrun --nproc-per-node 2 \
        examples/torch_train.py --steps 6 --save-every 3 --root /tmp/run

Trains a tiny transformer language model on synthetic tokens with DDP and
Adam (ZeroRedundancyOptimizer with --zero; FSDP2's fully_shard and AdamW
with --fsdp2) on the processes torchrun starts (gloo), saving every K steps
through a ckpt.torch.Checkpointer. Run without torchrun, it starts
--world-size processes itself (torch.multiprocessing.spawn). When ROOT
already holds a checkpoint it resumes from `latest`, on any world size: the
model and the optimizer state are resharded, each rank gets its own saved
RNG and data position back (a rank that did not exist then starts its own).
"""
import argparse
import os
import tempfile
import warnings
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
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


# FSDP2 warns when the root module returns a view (the logits of the 3-D
# Linear are one), in case the caller modifies it in place; this loop never
# does.
warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")


def build(args):
    """The model and optimizer of the chosen parallelism: DDP + Adam (or
    ZeroRedundancyOptimizer), or FSDP2 (fully_shard per block, then the
    root) + AdamW, whose parameters and optimizer state are DTensors."""
    torch.manual_seed(0)
    if args.fsdp2:
        model = TinyLM()
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)
    model = DistributedDataParallel(TinyLM())
    if args.zero:
        return model, ZeroRedundancyOptimizer(model.parameters(),
                                              optimizer_class=torch.optim.Adam, lr=1e-3)
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def train(rank, world_size, args, init_method):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank,
                            world_size=world_size)
    model, opt = build(args)
    data = torch.Generator().manual_seed(1000 + rank)
    # The model and the optimizer go in as they are (the Stateful protocol):
    # ckpt saves their state dicts (DTensors under FSDP2, each rank's own
    # partition under ZeRO) and hands the loaded ones back.
    state = {"model": model, "optim": opt,
             "rng": ct.PerRank(torch.get_rng_state()),
             "data": {"rng": ct.PerRank(data.get_state()), "position": ct.PerRank(0)},
             "step": 0}
    log = print if rank == 0 else (lambda *a, **k: None)
    checkpointer = ct.Checkpointer(args.root, keep_last=2, overwrite=True)

    # Every rank asks the same question of the same directory before any
    # rank saves, so they agree.
    if checkpointer.latest_step() is not None:
        t0 = time.perf_counter()
        report = checkpointer.load(state)
        torch.set_rng_state(state["rng"].value)
        data.set_state(state["data"]["rng"].value)
        saved_on = ckpt.Reader(args.root).world_size
        log(f"resumed from step {state['step']} of {args.root} (saved on {saved_on} ranks, "
            f"loading on {world_size}): {len(report.loaded)} entries, "
            f"{report.bytes_loaded / 2**20:.1f} MiB in {time.perf_counter() - t0:.2f} s")
        for name, why in report.not_loaded:
            log(f"  not loaded: {name}: {why}")
    dist.barrier()

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
            result = checkpointer.save(state, state["step"])
            log(f"saved step {state['step']} -> {result.path} "
                f"({result.stored_bytes / 2**20:.1f} MiB, {time.perf_counter() - t0:.2f} s)")
    checkpointer.close()
    finish()


def finish():
    """Ends this rank once every rank is done."""
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=2,
                   help="processes to start without torchrun (under torchrun: its world)")
    p.add_argument("--steps", type=int, default=6, help="train until this step")
    p.add_argument("--save-every", type=int, default=3, help="save every K steps")
    p.add_argument("--root", required=True, help="checkpoint root (resumes from latest)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--zero", action="store_true", help="DDP + ZeroRedundancyOptimizer(Adam)")
    group.add_argument("--fsdp2", action="store_true",
                       help="FSDP2 (fully_shard per block) + AdamW: DTensor state")
    args = p.parse_args()
    os.makedirs(args.root, exist_ok=True)
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, "env://")
        return
    with tempfile.TemporaryDirectory() as tmp:
        torch.multiprocessing.spawn(train, args=(args.world_size, args,
                                                 f"file://{os.path.join(tmp, 'store')}"),
                                    nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
