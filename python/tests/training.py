"""Ranks of the real-training tests (test_training.py), run on processes
forked by torch.multiprocessing, with gloo: a tiny transformer language model on
synthetic tokens, DDP + Adam or ZeroRedundancyOptimizer(Adam), one thread
per rank so that every run is bit for bit reproducible."""
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

import ckpt.torch as ct

VOCAB, SEQ, BATCH, DIM = 61, 12, 4, 32


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.block = torch.nn.TransformerEncoderLayer(DIM, nhead=2, dim_feedforward=64,
                                                      dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        return self.head(self.block(self.embed(tokens)))


class Job:
    """One rank's model, optimizer and data stream."""

    def __init__(self, rank, world, zero):
        torch.manual_seed(0)  # same initial weights on every rank
        self.model = DistributedDataParallel(TinyLM())
        if zero:
            self.opt = ZeroRedundancyOptimizer(self.model.parameters(),
                                               optimizer_class=torch.optim.Adam, lr=3e-3)
        else:
            self.opt = torch.optim.Adam(self.model.parameters(), lr=3e-3)
        self.data = torch.Generator().manual_seed(1000 + rank)  # this rank's stream
        torch.manual_seed(2000 + rank)  # the global RNG drives token noise
        self.position = 0  # batches consumed

    def step(self):
        tokens = torch.randint(VOCAB, (BATCH, SEQ + 1), generator=self.data)
        noise = torch.rand(BATCH, SEQ) < 0.1  # global RNG
        inputs = torch.where(noise, torch.zeros_like(tokens[:, :-1]), tokens[:, :-1])
        self.position += 1
        logits = self.model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.item()

    def state(self):
        return {"model": self.model.state_dict(),
                "optim": ct.optimizer_state_dict(self.model, self.opt),
                "data": {"rng": ct.PerRank(self.data.get_state()),
                         "position": ct.PerRank(self.position)},
                "rng": ct.PerRank(torch.get_rng_state()),
                # A bfloat16 replica (gloo has no bfloat16: ckpt's traffic is bytes).
                "lowp": self.model.module.head.weight.detach().to(torch.bfloat16)}

    def restore(self, state):
        ct.set_optimizer_state_dict(self.model, self.opt, state["optim"])
        self.data.set_state(state["data"]["rng"].value)
        self.position = state["data"]["position"].value
        torch.set_rng_state(state["rng"].value)


def _finish():
    """Ends this rank. os._exit skips the interpreter's teardown: with torch
    1.13, destroying DDP's reducer and the gloo process group at exit can
    deadlock (a gloo thread frees a tensor and waits for the GIL that the
    exiting thread holds while it joins that thread)."""
    dist.barrier()
    os._exit(0)


def _init(rank, world, store):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)


def _dump(out, rank, name, obj):
    with open(os.path.join(out, f"{name}-{rank}.json"), "w") as f:
        json.dump(obj, f)


def _owned_tensors(job):
    """This rank's model and optimizer tensors by entry name (clones)."""
    flat = {}
    state = job.state()
    for n, t in state["model"].items():
        flat["model." + n] = t.detach().clone()
    for p, st in state["optim"]["state"].items():
        for k, t in st.items():
            flat[f"optim.state.{p}.{k}"] = t.detach().clone()
    return flat


def uninterrupted(rank, world, store, root, out, zero, k, m):
    """Trains k steps, saves at k, trains m more; dumps the losses of
    steps k+1..k+m and (for the ZeRO checks) the saved tensors."""
    _init(rank, world, store)
    job = Job(rank, world, zero)
    for _ in range(k):
        job.step()
    ct.save(job.state(), root, k, verify_replicas=True)
    torch.save(_owned_tensors(job), os.path.join(out, f"saved-{rank}.pt"))
    _dump(out, rank, "losses", [job.step() for _ in range(m)])
    _finish()


def async_uninterrupted(rank, world, store, root, out, k, every, m):
    """Trains k steps with ct.save_async after every `every`-th (the
    optimizer step right after each call modifies the parameters while the
    save is written), trains m more steps with the last save still in
    flight, waits for it; dumps the losses of steps k+1..k+m and the steps
    each wait() committed."""
    _init(rank, world, store)
    job = Job(rank, world, zero=False)
    handles = []
    for step in range(1, k + 1):
        job.step()
        if step % every == 0:
            handles.append(ct.save_async(job.state(), root, step, keep_last=2))
    losses = [job.step() for _ in range(m)]
    committed = [int(h.wait().path[-8:]) for h in handles]
    _dump(out, rank, "losses", losses)
    _dump(out, rank, "committed", committed)
    _finish()


def resume(rank, world, store, root, out, zero, m):
    """Fresh processes: loads `latest`, trains m steps, dumps the losses."""
    _init(rank, world, store)
    job = Job(rank, world, zero)
    state = job.state()
    ct.load(state, root)
    job.restore(state)
    _dump(out, rank, "resumed", [job.step() for _ in range(m)])
    _finish()


def reshard_check(rank, world, store, root, out, saved_world, steps):
    """ZeRO on a different world size: loads (model, this rank's optimizer
    partition; per-rank data state only where the rank existed), compares
    every loaded tensor with the saved one bit for bit, then keeps training."""
    _init(rank, world, store)
    job = Job(rank, world, zero=True)
    state = job.state()
    report = ct.load(state, root, strict=False)
    ct.set_optimizer_state_dict(job.model, job.opt, state["optim"])
    saved = {}
    for r in range(saved_world):
        saved.update(torch.load(os.path.join(out, f"saved-{r}.pt")))
    mismatched = [n for n, t in _owned_tensors(job).items() if not torch.equal(t, saved[n])]
    compared = len(_owned_tensors(job))
    losses = [job.step() for _ in range(steps)]
    _dump(out, rank, f"reshard{world}", {"mismatched": mismatched, "compared": compared,
                                         "losses": losses, "not_loaded": report.not_loaded})
    _finish()
