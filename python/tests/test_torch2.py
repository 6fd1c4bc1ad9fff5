"""ckpt.torch with PyTorch 2's distributed state: DTensor (FSDP2, tensor
parallel, 2-D meshes, _StridedShard), ShardedTensor and the Stateful
protocol (modules, optimizers and LR schedulers passed as they are).

The offset computation and the Stateful protocol are tested in this
process (ranks as threads where several are needed). The training jobs
run on processes started by torch.multiprocessing with the fork start
method, talking over gloo: a forked child inherits the imported torch, so
a job starts in well under a second instead of the ~5 s a spawned child
spends importing torch and torch.distributed on two busy cores. The parent
never initialises torch.distributed. Every job is bit for bit
reproducible (one thread per process, data seeded by step and rank)."""
import collections
import json
import os
import warnings

import pytest

from conftest import RanksFailed, require, run_ranks

torch = require("torch")
require("torch.distributed.tensor")
import ckpt  # noqa: E402
import ckpt.torch as ct  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from ckpt.torch import dtensor as ckdt  # noqa: E402
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard  # noqa: E402
from torch.distributed.tensor.placement_types import _StridedShard  # noqa: E402

torch.set_num_threads(1)

VOCAB, SEQ, BATCH, DIM, FFN, HEADS = 61, 8, 4, 32, 66, 2
K, M = 3, 3  # save after step K, compare steps K+1..K+M


# ---------------------------------------------------------------------------
# The offset computation (ckpt.torch.dtensor.local_boxes), against torch's
# own sharding: each mesh coordinate's local tensor is made the way
# distribute_tensor makes it (each placement's _split_tensor, left to
# right over the mesh dimensions) and compared with the boxes ckpt saves.

def _torch_local(full, mesh_shape, coordinate, placements):
    t = full
    for m, p in enumerate(placements):
        if not p.is_replicate():
            shards, _ = p._split_tensor(t, mesh_shape[m], with_padding=False)
            t = shards[coordinate[m]]
    return t


def _ckpt_local(full, mesh_shape, coordinate, placements):
    specs = [ckdt._shard_spec("t", p) for p in placements]
    boxes = ckdt.local_boxes(full.shape, mesh_shape, coordinate, specs)
    idx = ckdt.local_indices(full.shape, mesh_shape, coordinate, specs)
    shape = [len(i) for i in idx]
    out = torch.full(shape, -1, dtype=full.dtype)
    for b in boxes:
        src = full[tuple(slice(o, o + s) for o, s in zip(b.offsets, b.sizes))]
        out[tuple(slice(o, o + s) for o, s in zip(b.local_offsets, b.sizes))] = src
    return out, boxes


LAYOUTS = [  # (mesh shape, placements)
    ((2,), [Shard(0)]), ((3,), [Shard(0)]), ((4,), [Shard(1)]), ((3,), [Replicate()]),
    ((2, 2), [Shard(0), Shard(1)]), ((2, 3), [Shard(0), Shard(0)]),
    ((2, 2), [Replicate(), Shard(1)]), ((3, 2), [Shard(1), Replicate()]),
    ((2, 2), [_StridedShard(0, split_factor=2), Shard(0)]),   # FSDP2 over TP
    ((2, 3), [_StridedShard(0, split_factor=3), Shard(0)]),
    ((2, 2), [Shard(0), _StridedShard(0, split_factor=2)]),   # gaps along dim 0
    ((2, 2), [Shard(1), _StridedShard(1, split_factor=2)]),   # gaps along dim 1
    ((2, 2, 2), [Replicate(), _StridedShard(0, split_factor=2), Shard(0)]),  # HSDP + TP
]


@pytest.mark.parametrize("mesh_shape,placements", LAYOUTS,
                         ids=[f"{m}-{'-'.join(map(str, p))}" for m, p in LAYOUTS])
def test_local_boxes_hold_what_torch_distributes(mesh_shape, placements):
    import itertools
    for shape in [(8, 6), (7, 5), (13, 3), (2, 9), (1, 4), (66, 3)]:
        full = torch.arange(shape[0] * shape[1]).reshape(shape)
        covered = torch.zeros(shape, dtype=torch.int64)
        for coordinate in itertools.product(*(range(n) for n in mesh_shape)):
            ours, boxes = _ckpt_local(full, mesh_shape, coordinate, placements)
            theirs = _torch_local(full, mesh_shape, coordinate, placements)
            assert torch.equal(ours, theirs), (shape, coordinate)
            for b in boxes:
                covered[tuple(slice(o, o + s) for o, s in zip(b.offsets, b.sizes))] += 1
        # Every element is held by the same number of ranks (the replicas).
        assert covered.min() == covered.max() >= 1, shape


def test_local_boxes_agree_with_torchs_first_offsets():
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
    import itertools
    for mesh_shape, placements in LAYOUTS:
        specs = [ckdt._shard_spec("t", p) for p in placements]
        for shape in [(8, 6), (7, 5), (2, 9)]:
            for c in itertools.product(*(range(n) for n in mesh_shape)):
                theirs = _compute_local_shape_and_global_offset(shape, mesh_shape, list(c),
                                                                placements)
                idx = ckdt.local_indices(shape, mesh_shape, c, specs)
                local = tuple(len(i) for i in idx)
                first = tuple(i[0] if len(i) else g for i, g in zip(idx, shape))
                assert (local, first) == theirs, (mesh_shape, placements, shape, c)


def test_a_strided_shard_with_gaps_is_several_boxes():
    specs = [(0, 1), (0, 2)]  # Shard(0), _StridedShard(0, split_factor=2) on a 2x2 mesh
    assert ckdt.local_boxes((8, 3), (2, 2), (0, 1), specs) == [
        ckdt.LocalBox((1, 0), (1, 3), (0, 0)), ckdt.LocalBox((3, 0), (1, 3), (1, 0))]
    # FSDP2 over tensor parallelism: one box, also when uneven.
    assert ckdt.local_boxes((66, 4), (2, 2), (0, 1), [(0, 2), (0, 1)]) == [
        ckdt.LocalBox((33, 0), (17, 4), (0, 0))]
    # An empty shard (2 rows on 3 ranks) is one empty box at the end.
    assert ckdt.local_boxes((2, 4), (3,), (2,), [(0, 1)]) == [
        ckdt.LocalBox((2, 0), (0, 4), (0, 0))]


def test_partial_and_unknown_placements_are_refused_naming_the_entry():
    with pytest.raises(ckpt.InvalidArgumentError,
                       match="entry 'm.w': a DTensor with a Partial placement"):
        ckdt._shard_spec("m.w", Partial())


# ---------------------------------------------------------------------------
# The Stateful protocol in one process

class Counter:
    """A user object with the Stateful protocol."""

    def __init__(self, fail=False):
        self.n, self.history, self.fail = 0, [0.5], fail

    def state_dict(self):
        if self.fail:
            raise RuntimeError("boom")
        return {"n": self.n, "history": list(self.history), "t": torch.tensor([self.n])}

    def load_state_dict(self, sd):
        self.n, self.history = sd["n"], list(sd["history"])
        assert int(sd["t"]) == self.n


def _plain_job(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched


def _plain_step(model, opt, sched, k):
    g = torch.Generator().manual_seed(k)
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
    loss = F.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    return loss.item()


def test_modules_optimizers_and_schedulers_are_saved_and_restored_as_they_are(tmp_path):
    model, opt, sched = _plain_job(0)
    counter = Counter()
    for k in range(3):
        _plain_step(model, opt, sched, k)
        counter.n += 1
    ct.save({"model": model, "optim": opt, "sched": sched, "user": counter, "step": 3},
            str(tmp_path), 3)
    expected = [_plain_step(model, opt, sched, k) for k in range(3, 6)]

    r = ckpt.Reader(str(tmp_path))
    names = {e.name for e in r.entries()}
    assert {"model.0.weight", "optim.state.0.weight.exp_avg", "optim.param_groups",
            "sched.last_epoch", "user.n", "user.t"} <= names

    model2, opt2, sched2 = _plain_job(1)  # other initial values, no optimizer state
    state = {"model": model2, "optim": opt2, "sched": sched2, "user": Counter(), "step": None}
    ct.load(state, str(tmp_path))
    assert state["step"] == 3 and state["model"] is model2  # the objects stay in the dict
    assert state["user"].n == 3 and sched2.last_epoch == 3
    assert [_plain_step(model2, opt2, sched2, k) for k in range(3, 6)] == expected

    # Control: without the optimizer and scheduler state the losses differ.
    model3, opt3, sched3 = _plain_job(1)
    ct.load({"model": model3, "optim": opt3, "sched": sched3, "user": Counter(), "step": None},
            str(tmp_path), filter=lambda n: n.startswith("model."))
    assert [_plain_step(model3, opt3, sched3, k) for k in range(3, 6)] != expected


def test_a_failing_state_dict_fails_every_rank_naming_the_entry(tmp_path):
    def save(comm):
        return ct.save({"w": torch.ones(2), "user": Counter(fail=comm.rank == 1)},
                       str(tmp_path), 1, process_group=comm)
    with pytest.raises(RanksFailed) as e:
        run_ranks(2, save)
    assert "entry 'user': Counter.state_dict() raised RuntimeError: boom" in str(e.value.errors[1])
    assert ("save: rank 1 failed: UnknownError: entry 'user': Counter.state_dict() raised "
            "RuntimeError: boom") in str(e.value.errors[0])


def test_a_failing_load_state_dict_fails_every_rank_naming_the_entry(tmp_path):
    ct.save({"user": Counter()}, str(tmp_path), 1)

    class Refuses(Counter):
        def load_state_dict(self, sd):
            raise ValueError("not today")

    def load(comm):
        return ct.load({"user": Refuses() if comm.rank == 0 else Counter()}, str(tmp_path),
                       process_group=comm)
    with pytest.raises(RanksFailed) as e:
        run_ranks(2, load)
    assert ("entry 'user': restoring the loaded state into the Refuses raised ValueError: "
            "not today") in str(e.value.errors[0])
    assert "load: rank 0 failed: UnknownError: entry 'user'" in str(e.value.errors[1])


def _count_dsd_calls(monkeypatch):
    """Counts the calls of torch.distributed.checkpoint.state_dict's getters
    and setters (still calling them)."""
    from torch.distributed.checkpoint import state_dict as dsd
    calls = collections.Counter()
    for name in ("get_state_dict", "set_state_dict", "get_model_state_dict",
                 "set_model_state_dict", "get_optimizer_state_dict",
                 "set_optimizer_state_dict"):
        def counted(*a, _f=getattr(dsd, name), _n=name, **k):
            calls[_n] += 1
            return _f(*a, **k)
        monkeypatch.setattr(dsd, name, counted)
    return calls


def test_a_module_and_its_optimizer_go_through_one_get_and_one_set_state_dict(
        tmp_path, monkeypatch):
    model, opt, sched = _plain_job(0)
    _plain_step(model, opt, sched, 0)
    calls = _count_dsd_calls(monkeypatch)
    # The optimizer first: the pair's state is got at whichever comes first.
    ct.save({"optim": opt, "nested": {"model": model}, "sched": sched}, str(tmp_path), 1)
    assert calls == {"get_state_dict": 1}
    expected = [_plain_step(model, opt, sched, k) for k in range(1, 4)]

    model2, opt2, sched2 = _plain_job(1)
    calls.clear()
    ct.load({"optim": opt2, "nested": {"model": model2}, "sched": sched2}, str(tmp_path))
    assert calls == {"get_state_dict": 1, "set_state_dict": 1}
    assert [_plain_step(model2, opt2, sched2, k) for k in range(1, 4)] == expected

    # Two optimizers of one module: each goes through its own calls.
    model3, opt3, _ = _plain_job(2)
    opt4 = torch.optim.SGD(model3.parameters(), lr=0.1, momentum=0.9)
    calls.clear()
    ct.save({"model": model3, "a": opt3, "b": opt4}, str(tmp_path), 2)
    assert calls == {"get_model_state_dict": 1, "get_optimizer_state_dict": 2}
    calls.clear()
    ct.load({"model": model3, "a": opt3, "b": opt4}, str(tmp_path))
    assert calls == {"get_model_state_dict": 1, "get_optimizer_state_dict": 2,
                     "set_model_state_dict": 1, "set_optimizer_state_dict": 2}


def test_a_failing_restore_of_a_pair_names_both_entries(tmp_path, monkeypatch):
    model, opt, _ = _plain_job(0)
    ct.save({"model": model, "optim": opt}, str(tmp_path), 1)
    from torch.distributed.checkpoint import state_dict as dsd

    def refuse(*a, **k):
        raise ValueError("not today")
    monkeypatch.setattr(dsd, "set_state_dict", refuse)
    with pytest.raises(ckpt.UnknownError,
                       match="entries 'model' and 'optim': restoring the loaded state into "
                             "the Sequential and the AdamW raised ValueError: not today"):
        ct.load({"model": model, "optim": opt}, str(tmp_path))
    with pytest.raises(ckpt.UnknownError,
                       match="entries 'optim' and 'model': restoring the loaded state into "
                             "the AdamW and the Sequential raised ValueError: not today"):
        ct.load({"optim": opt, "model": model}, str(tmp_path))


def test_an_optimizer_without_its_model_is_refused_naming_the_entry(tmp_path):
    model, opt, _ = _plain_job(0)
    with pytest.raises(ckpt.InvalidArgumentError,
                       match="entry 'optim': an optimizer is saved by parameter names"):
        ct.save({"optim": opt}, str(tmp_path), 1)


# ---------------------------------------------------------------------------
# Training jobs on processes

def _child(rank, fn, world, store, args):
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    fn(rank, world, *args)
    # os._exit skips the interpreter's teardown (gloo and FSDP hooks at
    # exit); the barrier keeps every rank's group alive until all are done.
    dist.barrier()
    os._exit(0)


def run(fn, world, tmp_path, *args):
    """fn(rank, world, *args) on `world` forked processes over gloo."""
    ct.release()  # no Writer of this process is handed to the children
    store = tmp_path / f"store-{fn.__name__}-{world}-{len(os.listdir(tmp_path))}"
    torch.multiprocessing.start_processes(_child, args=(fn, world, str(store), args),
                                          nprocs=world, join=True, start_method="fork")


def dump(out, name, rank, obj):
    with open(os.path.join(out, f"{name}-{rank}.json"), "w") as f:
        json.dump(obj, f)


def read(out, name, rank):
    with open(os.path.join(out, f"{name}-{rank}.json")) as f:
        return json.load(f)


@pytest.fixture
def dirs(tmp_path):
    (tmp_path / "out").mkdir()
    return str(tmp_path / "root"), str(tmp_path / "out")


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(DIM), torch.nn.LayerNorm(DIM)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(DIM, DIM) for _ in range(4))
        self.fc1, self.fc2 = torch.nn.Linear(DIM, FFN), torch.nn.Linear(FFN, DIM)

    def forward(self, x):
        b, s, _ = x.shape
        h = self.ln1(x)
        # Under tensor parallelism q, k, v hold this rank's heads only.
        q, k, v = (f(h).view(b, s, -1, DIM // HEADS).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyLM(torch.nn.Module):
    """Vocabulary 61 and FFN 66: FSDP2's dim-0 shards are uneven on 2, 3
    and 4 ranks."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.norm = torch.nn.LayerNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB)
        self.gate = torch.nn.Linear(DIM, 2)  # 2 rows: an empty shard on 3 ranks

    def forward(self, tokens):
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x)
        x = self.norm(x)
        return self.head(x) + self.gate(x).sum(-1, keepdim=True)


TP_PLAN = {f"blocks.{i}.{n}": style for i in range(2) for n, style in (
    ("q", "col"), ("k", "col"), ("v", "col"), ("o", "row"), ("fc1", "col"), ("fc2", "row"))}


def _shard(model, mesh):
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)


def fully_shard(module, mesh):
    from torch.distributed.fsdp import fully_shard as fsdp2
    fsdp2(module, mesh=mesh)


class Job:
    """One rank's model, AdamW and LR schedule: FSDP2 over `world` ranks
    (layout "fsdp"), FSDP2 over tensor parallelism on a (dp, tp) mesh
    ("2d"), DDP with ZeroRedundancyOptimizer ("zero"), or a plain module
    ("plain")."""

    def __init__(self, world, layout="fsdp", seed=0):
        from torch.distributed.device_mesh import init_device_mesh
        torch.manual_seed(seed)
        self.model, self.dp_rank = TinyLM(), dist.get_rank()
        if layout == "fsdp":
            _shard(self.model, init_device_mesh("cpu", (world,)))
        elif layout == "2d":
            from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                           parallelize_module)
            mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
            styles = {"col": ColwiseParallel, "row": RowwiseParallel}
            parallelize_module(self.model, mesh["tp"],
                               {n: styles[s]() for n, s in TP_PLAN.items()})
            _shard(self.model, mesh["dp"])
            self.dp_rank = mesh.get_coordinate()[0]
        if layout == "zero":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            self.model = torch.nn.parallel.DistributedDataParallel(self.model)
            self.opt = ZeroRedundancyOptimizer(self.model.parameters(), torch.optim.AdamW,
                                               lr=3e-3, weight_decay=0.1)
        else:
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-3, weight_decay=0.1)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=2, gamma=0.7)
        self.step_no = 0

    def step(self):
        g = torch.Generator().manual_seed(1000 * self.step_no + self.dp_rank)
        tokens = torch.randint(VOCAB, (BATCH, SEQ + 1), generator=g)
        logits = self.model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.sched.step()
        self.step_no += 1
        return loss.item()

    def state(self):
        return {"model": self.model, "optim": self.opt, "sched": self.sched,
                "step": self.step_no}

    def load(self, root, **kw):
        state = self.state()
        report = ct.load(state, root, **kw)
        self.step_no = state["step"]
        return report

    def full(self):
        """Every parameter and optimizer-state tensor, gathered whole
        (DTensor.full_tensor(): a collective; every rank calls it)."""
        from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                             get_optimizer_state_dict)
        out = {f"model.{n}": t for n, t in get_model_state_dict(self.model).items()}
        osd = get_optimizer_state_dict(self.model, self.opt)
        for fqn, st in osd["state"].items():
            out.update({f"optim.{fqn}.{k}": t for k, t in st.items()})
        return {n: (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()
                for n, t in out.items()}


def _mismatched(full, saved):
    assert set(full) == set(saved)
    return sorted(n for n in saved if not torch.equal(full[n], saved[n]))


def fsdp_uninterrupted(rank, world, root, out):
    """Trains K steps, saves in the background while training M more (the
    optimizer steps change the DTensors while the save is written)."""
    job = Job(world)
    for _ in range(K):
        job.step()
    handle = ct.save_async(job.state(), root, K)
    full = job.full()
    if rank == 0:
        torch.save(full, os.path.join(out, "saved.pt"))
    dump(out, "losses", rank, [job.step() for _ in range(M)])
    handle.wait()


def fsdp_resume(rank, world, root, out):
    job = Job(world, seed=1)
    job.load(root)
    dump(out, "resumed", rank, [job.step() for _ in range(M)])
    # Control: the same resume without the optimizer and LR state.
    control = Job(world, seed=1)
    control.load(root, filter=lambda n: not n.startswith(("optim.", "sched.")))
    dump(out, "control", rank, [control.step() for _ in range(M)])


def load_saved(rank, world, root, out, layout, tag):
    """Loads the checkpoint into a `layout` Job of `world` ranks made with
    another seed, and dumps, as `tag`+world, which full tensors differ from
    the saved ones (out/saved.pt) after the load and how many did before,
    and the losses of two more steps."""
    job = Job(world, layout=layout, seed=1)
    before = job.full()
    job.load(root)
    saved = torch.load(os.path.join(out, "saved.pt"))
    dump(out, f"{tag}{world}", rank, {
        "mismatched": _mismatched(job.full(), saved),
        "differed_before": len(_mismatched(before, saved)), "n": len(saved),
        "losses": [job.step() for _ in range(2)]})


def test_fsdp2_resume_is_bit_identical_and_reshards_to_1_and_3(tmp_path, dirs):
    root, out = dirs
    run(fsdp_uninterrupted, 2, tmp_path, root, out)
    run(fsdp_resume, 2, tmp_path, root, out)
    for rank in range(2):
        assert read(out, "resumed", rank) == read(out, "losses", rank)
        assert read(out, "control", rank) != read(out, "losses", rank)

    r = ckpt.Reader(root)
    assert r.world_size == 2 and r.step == K
    emb = r.find("model.embed.weight")
    assert (list(emb.shape), chunks(emb)) == (
        [61, 32], [(((0, 0), (31, 32)), 0), (((31, 0), (30, 32)), 1)])
    for world in (1, 3):
        run(load_saved, world, tmp_path, root, out, "fsdp", "reshard")
        for rank in range(world):
            got = read(out, f"reshard{world}", rank)
            assert got["mismatched"] == [], (world, rank)
            assert got["differed_before"] == got["n"]  # the control: all had to change
            assert all(loss == loss and loss < 10 for loss in got["losses"])


def zero_run(rank, world, root, out, resume):
    job = Job(world, layout="zero", seed=int(resume))
    if resume:
        job.load(root)
        dump(out, "resumed", rank, [job.step() for _ in range(M)])
        control = Job(world, layout="zero", seed=1)  # the model alone
        control.load(root, filter=lambda n: not n.startswith(("optim.", "sched.")))
        dump(out, "control", rank, [control.step() for _ in range(M)])
        return
    for _ in range(K):
        job.step()
    ct.save(job.state(), root, K)
    dump(out, "losses", rank, [job.step() for _ in range(M)])


def test_ddp_and_zero_as_stateful_values_resume_bit_identically(tmp_path, dirs):
    """A ZeroRedundancyOptimizer passed as it is: each rank saves the
    partition it owns (ckpt.torch.optimizer_state_dict), not a
    consolidated copy."""
    root, out = dirs
    run(zero_run, 2, tmp_path, root, out, False)
    run(zero_run, 2, tmp_path, root, out, True)
    for rank in range(2):
        assert read(out, "resumed", rank) == read(out, "losses", rank)
        assert read(out, "control", rank) != read(out, "losses", rank)
    r = ckpt.Reader(root)
    owners = {e.chunks[0][1] for e in r.entries() if e.name.startswith("optim.state.")}
    assert owners == {0, 1}
    assert r.find("model.embed.weight") is not None  # FQNs without DDP's "module."


# FIELD-LESSONS 3 with FSDP2. CPUOffloadPolicy needs an accelerator:
# fully_shard(..., offload_policy=CPUOffloadPolicy()) raises "Cannot access
# accelerator device when none is available" on this CPU-only torch, so the
# optimizer state is FSDP2's own (on the CPU here, as offloaded state would
# be): uneven dim-0 shards whose chunks are computed on each rank from its
# DTensor alone, and one rank with an empty shard on 3 ranks.
def lesson3_save(rank, world, root, out):
    job = Job(world)
    for _ in range(2):
        job.step()
    state = job.opt.state[job.model.embed.weight]
    dump(out, "local", rank, {"embed.exp_avg": list(state["exp_avg"].to_local().shape),
                              "device": str(state["exp_avg"].to_local().device)})
    ct.save(job.state(), root, 2)
    full = job.full()
    if rank == 0:
        torch.save(full, os.path.join(out, "saved.pt"))


def lesson3_load(rank, world, root, out):
    job = Job(world, seed=1)
    job.load(root)
    gate = job.opt.state[job.model.gate.weight]["exp_avg_sq"].to_local()
    dump(out, "loaded", rank, {"mismatched": _mismatched(job.full(), torch.load(
        os.path.join(out, "saved.pt"))), "gate_rows": gate.shape[0]})


def test_uneven_fsdp2_optimizer_shards_saved_on_2_load_exactly_on_3(tmp_path, dirs):
    root, out = dirs
    run(lesson3_save, 2, tmp_path, root, out)
    assert [read(out, "local", r) for r in range(2)] == [
        {"embed.exp_avg": [31, 32], "device": "cpu"}, {"embed.exp_avg": [30, 32], "device": "cpu"}]
    r = ckpt.Reader(root)
    assert chunks(r.find("optim.state.embed.weight.exp_avg")) == [
        (((0, 0), (31, 32)), 0), (((31, 0), (30, 32)), 1)]
    run(lesson3_load, 3, tmp_path, root, out)
    got = [read(out, "loaded", r) for r in range(3)]
    assert [g["mismatched"] for g in got] == [[], [], []]
    assert [g["gate_rows"] for g in got] == [1, 1, 0]  # 2 rows on 3 ranks


def tp2d_save(rank, world, root, out):
    job = Job(world, layout="2d")
    for _ in range(2):
        job.step()
    w = job.model.blocks[0].fc1.weight
    dump(out, "placements", rank, [repr(p) for p in w.placements])
    ct.save(job.state(), root, 2)
    full = job.full()
    if rank == 0:
        torch.save(full, os.path.join(out, "saved.pt"))


def test_fsdp_over_tensor_parallel_on_4_loads_on_a_1d_mesh_of_2_and_a_plain_module(
        tmp_path, dirs):
    root, out = dirs
    run(tp2d_save, 4, tmp_path, root, out)
    # FSDP2 over TP shards fc1's rows with _StridedShard (66 rows: uneven).
    assert read(out, "placements", 0) == ["_StridedShard(dim=0, sf=2)", "Shard(dim=0)"]
    r = ckpt.Reader(root)
    assert [c[0] for c, _ in chunks(r.find("model.blocks.0.fc1.weight"))] == [
        (0, 0), (17, 0), (33, 0), (50, 0)]
    # fc2.bias is (Shard(0), Replicate()): each half written once, by one of
    # its two holders, the two halves by different ranks.
    bias = chunks(r.find("model.blocks.0.fc2.bias"))
    assert [c for c, _ in bias] == [((0,), (16,)), ((16,), (16,))]
    assert bias[0][1] in (0, 1) and bias[1][1] in (2, 3)
    for world, layout in ((2, "fsdp"), (1, "plain")):
        run(load_saved, world, tmp_path, root, out, layout, layout)
        for rank in range(world):
            got = read(out, f"{layout}{world}", rank)
            assert got["mismatched"] == [], (layout, rank)
            assert got["differed_before"] == got["n"]  # the control: all had to change
            assert all(loss == loss and loss < 10 for loss in got["losses"])


# ---------------------------------------------------------------------------
# Layouts beyond FSDP2 and TP, and bad input, on 2 or 4 processes

def gapped_layouts(rank, world, root, out):
    """_StridedShard layouts whose local tensors are two boxes (gaps along
    dim 0, and along dim 1, where the boxes' views are not contiguous), and
    a non-contiguous local tensor."""
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2, 2))
    full0 = torch.arange(8 * 3, dtype=torch.float32).reshape(8, 3)
    full1 = full0.reshape(3, 8).clone()
    p0 = [Shard(0), _StridedShard(0, split_factor=2)]
    p1 = [Shard(1), _StridedShard(1, split_factor=2)]
    coord = mesh.get_coordinate()

    def make(full, placements, fill=None):
        d = placements[0].dim
        idx = ckdt.local_indices(full.shape, (2, 2), coord, [(d, 1), (d, 2)])[d]
        local = full.index_select(d, torch.tensor(list(idx)))
        local = local if fill is None else torch.full_like(local, fill)
        return DTensor.from_local(local, mesh, placements, shape=full.shape,
                                  stride=full.stride(), run_check=False)
    # A non-contiguous local tensor: the transposed view of its storage.
    storage = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * coord[0]
    nc = DTensor.from_local(storage.t(), mesh, [Shard(0), Replicate()], run_check=False)
    ct.save({"g0": make(full0, p0), "g1": make(full1, p1), "nc": nc}, root, 1)

    g0, g1 = make(full0, p0, fill=-1.0), make(full1, p1, fill=-1.0)
    target = torch.zeros(2, 3)
    nc2 = DTensor.from_local(target.t(), mesh, [Shard(0), Replicate()], run_check=False)
    done = []
    ct.load({"g0": g0, "g1": g1, "nc": nc2}, root, on_complete=done.append)
    dump(out, "gapped", rank, {
        "g0": torch.equal(g0.to_local(), make(full0, p0).to_local()),
        "g1": torch.equal(g1.to_local(), make(full1, p1).to_local()),
        "g1_contiguous_views": g1.to_local()[:, :1].is_contiguous(),
        "nc": torch.equal(target, storage), "done": sorted(done)})


def test_gapped_strided_shards_and_non_contiguous_locals_round_trip(tmp_path, dirs):
    root, out = dirs
    run(gapped_layouts, 4, tmp_path, root, out)
    for rank in range(4):
        assert read(out, "gapped", rank) == {"g0": True, "g1": True,
                                             "g1_contiguous_views": False, "nc": True,
                                             "done": ["g0", "g1", "nc"]}
    r = ckpt.Reader(root)
    full0 = torch.arange(8 * 3, dtype=torch.float32).reshape(8, 3)
    out0 = torch.zeros(8, 3)
    r.load([ckpt.LoadRequest("g0", ckpt.float32, (8, 3), ckpt.Box.full((8, 3)), out0)],
           allow_unrequested=True)
    assert torch.equal(out0, full0)


def sharded_tensor_round_trip(rank, world, root, out):
    """A ShardedTensor (5 rows over 2 ranks: 3 and 2) saved; loaded into a
    DTensor Shard(1) and into a ShardedTensor."""
    from torch.distributed._shard.sharded_tensor import Shard as STShard
    from torch.distributed._shard.sharded_tensor import init_from_local_shards
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor
    full = torch.arange(20, dtype=torch.float32).reshape(5, 4)
    rows = [(0, 3), (3, 2)][rank]

    def st(local):
        md = ShardMetadata([rows[0], 0], [rows[1], 4], f"rank:{rank}/cpu")
        return init_from_local_shards([STShard(local, md)], [5, 4])
    ct.save({"st": st(full[rows[0]:rows[0] + rows[1]].clone())}, root, 1)
    mesh = init_device_mesh("cpu", (world,))
    as_dt = distribute_tensor(torch.zeros(5, 4), mesh, [Shard(1)])
    back = st(torch.zeros(rows[1], 4))
    ct.load({"st": as_dt}, root)
    ct.load({"st": back}, root)
    dump(out, "st", rank, {"dt": torch.equal(as_dt.full_tensor(), full),
                           "st": torch.equal(back.local_shards()[0].tensor,
                                             full[rows[0]:rows[0] + rows[1]])})


def test_sharded_tensors_save_and_load_across_layouts(tmp_path, dirs):
    root, out = dirs
    run(sharded_tensor_round_trip, 2, tmp_path, root, out)
    assert [read(out, "st", r) for r in range(2)] == [{"dt": True, "st": True}] * 2
    assert chunks(ckpt.Reader(root).find("st")) == [
        (((0, 0), (3, 4)), 0), (((3, 0), (2, 4)), 1)]


def chunks(entry):
    """An entry's chunks as ((offset, size), rank), in offset order."""
    return sorted(((tuple(b.offset), tuple(b.size)), r) for b, r in entry.chunks)


def _error(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test compares the messages
        return f"{type(e).__name__}: {e}"
    return None


def bad_input(rank, world, root, out):
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,))
    errors = {}
    partial = DTensor.from_local(torch.ones(4), mesh, [Partial()])
    errors["partial"] = _error(lambda: ct.save({"m": {"p": partial}}, root, 1))
    # A DTensor over both ranks saved on a group of one: the other rank's
    # shard would be missing.
    alone = [dist.new_group([0]), dist.new_group([1])][rank]
    w = DTensor.from_local(torch.ones(2, 3), mesh, [Shard(0)])
    errors["mesh"] = _error(lambda: ct.save({"w": w}, root, 1, process_group=alone))
    errors["state_dict"] = _error(lambda: ct.save(
        {"w": w, "user": Counter(fail=rank == 1)}, root, 1))
    ct.save({"w": w}, root, 2)
    wide = DTensor.from_local(torch.ones(2, 4), mesh, [Shard(0)])
    errors["shape"] = _error(lambda: ct.load({"w": wide}, root))
    f64 = DTensor.from_local(torch.ones(2, 3, dtype=torch.float64), mesh, [Shard(0)])
    errors["dtype"] = _error(lambda: ct.load({"w": f64}, root))
    dump(out, "errors", rank, errors)


def test_bad_input_raises_naming_the_entry_on_every_rank(tmp_path, dirs):
    root, out = dirs
    run(bad_input, 2, tmp_path, root, out)
    for rank in range(2):
        e = read(out, "errors", rank)
        assert e["partial"].startswith(
            "InvalidArgumentError: entry 'm.p': a DTensor with a Partial placement"), e
        assert f"entry 'w': the DTensor's mesh holds ranks [0, 1], but the save runs on " \
            f"ranks [{rank}] (ranks [{1 - rank}] are not in its process group)" in e["mesh"]
        assert "entry 'user': Counter.state_dict() raised RuntimeError: boom" in e["state_dict"]
        assert "w: global shape [4, 3] in checkpoint, [4, 4] requested" in e["shape"], e
        assert e["dtype"].startswith("InvalidArgumentError") and "w:" in e["dtype"] and \
            "float64" in e["dtype"], e
    assert read(out, "errors", 0)["state_dict"].startswith(
        "UnknownError: save: rank 1 failed: UnknownError: entry 'user'")
