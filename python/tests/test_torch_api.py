"""ckpt.torch on one process and on ranks as threads (a Python
communicator): values, Shards, PerRank, strictness, the failures of
FIELD-LESSONS 1 and 2, and the errors that name the entry."""
import math

import pytest

from conftest import RanksFailed, require, run_ranks

torch = require("torch")
import ckpt  # noqa: E402
import ckpt.torch as ct  # noqa: E402
from ckpt import values  # noqa: E402

torch.set_num_threads(1)


def test_python_values_come_back_with_their_types(tmp_path):
    v = {"int": 2**80, "neg": -3, "float": 0.1, "inf": math.inf, "none": None, "t": True,
         "s": "ünï", "b": b"\x00\xff", "tuple": (1, "a"), "list": [1.5, [None]],
         "intkeys": {1: "a", 2: (3,)}}
    ct.save({"cfg": v, "nan": math.nan}, str(tmp_path), 1)
    out = {"cfg": {k: None for k in v}, "nan": 0.0}
    ct.load(out, str(tmp_path))
    assert out["cfg"] == v and math.isnan(out["nan"])
    assert type(out["cfg"]["tuple"]) is tuple and type(out["cfg"]["intkeys"]) is dict


def test_value_encoding_never_runs_code():
    with pytest.raises(ckpt.DataLossError, match="unknown tag 'pickle'"):
        values.decode(b'{"ckpt_value":1,"v":["pickle","gASV"]}', "entry 'x'")
    with pytest.raises(ckpt.DataLossError, match="version 2"):
        values.decode(b'{"ckpt_value":2,"v":["none"]}')


def test_unsupported_value_type_names_the_entry(tmp_path):
    with pytest.raises(TypeError, match="entry 'opt.x': a builtins.set"):
        ct.save({"opt": {"x": {1, 2}}}, str(tmp_path), 1)


def test_bfloat16_bool_and_zero_dim_tensors_round_trip(tmp_path):
    src = {"bf": torch.randn(5).bfloat16(), "b": torch.tensor([True, False, True]),
           "step": torch.tensor(7.0), "h": torch.randn(2, 2).half()}
    ct.save(src, str(tmp_path), 1)
    dst = {k: torch.zeros_like(t) for k, t in src.items()}
    ct.load(dst, str(tmp_path))
    for k in src:
        assert torch.equal(src[k], dst[k]), k
    assert ckpt.Reader(str(tmp_path)).find("bf").dtype == ckpt.bfloat16


def test_load_is_in_place(tmp_path):
    ct.save({"w": torch.arange(6.0)}, str(tmp_path), 1)
    w = torch.zeros(6)
    sd = {"w": w}
    ct.load(sd, str(tmp_path))
    assert sd["w"] is w and torch.equal(w, torch.arange(6.0))


def test_non_contiguous_tensor_is_refused_naming_the_entry(tmp_path):
    t = torch.zeros(4, 4).t()
    with pytest.raises(ckpt.InvalidArgumentError, match="entry 'm.w': the tensor is not contig"):
        ct.save({"m": {"w": t}}, str(tmp_path), 1)
    ct.save({"m": {"w": torch.zeros(4, 4)}}, str(tmp_path), 1)
    with pytest.raises(ValueError, match="entry 'm.w': the tensor is not contiguous"):
        ct.load({"m": {"w": t}}, str(tmp_path))


def test_shape_and_dtype_mismatch_name_the_entry(tmp_path):
    ct.save({"w": torch.zeros(4, 4)}, str(tmp_path), 1)
    with pytest.raises(ckpt.InvalidArgumentError,
                       match=r"w: global shape \[4, 4\] in checkpoint, \[4, 5\]"):
        ct.load({"w": torch.zeros(4, 5)}, str(tmp_path))
    with pytest.raises(ckpt.InvalidArgumentError,
                       match="w: .*float32.*float64|w: .*float64.*float32"):
        ct.load({"w": torch.zeros(4, 4, dtype=torch.float64)}, str(tmp_path))


def test_missing_key_is_an_error_when_strict_and_reported_otherwise(tmp_path):
    ct.save({"a": torch.ones(2)}, str(tmp_path), 1)
    with pytest.raises(KeyError, match="entry 'b': not in checkpoint"):
        ct.load({"a": torch.zeros(2), "b": torch.zeros(2)}, str(tmp_path))
    report = ct.load({"a": torch.zeros(2), "b": torch.zeros(2)}, str(tmp_path), strict=False)
    assert report.not_loaded == [("b", f"not in checkpoint {tmp_path}/step-00000001")]


def test_shard_outside_its_global_shape_is_refused(tmp_path):
    with pytest.raises(ckpt.InvalidArgumentError,
                       match=r"entry 'w': Chunk \[2:6, 0:2\] lies outside the global shape \[4, 2\]"):
        ct.save({"w": ct.Chunk(torch.zeros(4, 2), (4, 2), offsets=(2, 0))}, str(tmp_path), 1)
    with pytest.raises(ckpt.InvalidArgumentError, match=r"entry 'f': Chunk flat\[6:10\)"):
        ct.save({"f": ct.Chunk(torch.zeros(4), (8,), flat_start=6)}, str(tmp_path), 1)


def test_shards_reshard_between_flat_ranges_and_boxes(tmp_path):
    full = torch.arange(24.0).reshape(4, 6)
    flat = full.reshape(-1)
    cuts = [0, 7, 24]  # uneven flat ranges on 2 ranks

    def save(comm):
        r = comm.rank
        piece = flat[cuts[r]:cuts[r + 1]].clone()
        return ct.save({"w": ct.Chunk(piece, (4, 6), flat_start=cuts[r])}, str(tmp_path), 1,
                       process_group=comm)
    run_ranks(2, save)

    def load(comm):  # 3 ranks, column blocks of 2
        out = torch.zeros(4, 2)
        ct.load({"w": ct.Chunk(out, (4, 6), offsets=(0, 2 * comm.rank))}, str(tmp_path),
                process_group=comm)
        return out
    outs = run_ranks(3, load)
    assert torch.equal(torch.cat(outs, dim=1), full)


def test_values_must_agree_across_ranks_unless_per_rank(tmp_path):
    def save(comm):
        return ct.save({"lr": 0.1 * (comm.rank + 1), "w": torch.ones(2)}, str(tmp_path), 1,
                       process_group=comm)
    with pytest.raises(RanksFailed) as e:
        run_ranks(2, save)
    for err in e.value.errors:
        assert isinstance(err, ckpt.InvalidArgumentError)
        assert ("entry 'lr': Python values differ between ranks (equal within each group: "
                "rank 0 | rank 1)") in str(err)


def test_verify_replicas_names_the_ranks_whose_copies_differ(tmp_path):
    def save(comm):
        w = torch.ones(3) if comm.rank != 2 else torch.full((3,), 2.0)
        return ct.save({"w": w}, str(tmp_path), 1, process_group=comm, verify_replicas=True)
    with pytest.raises(RanksFailed) as e:
        run_ranks(3, save)
    assert "entry 'w': replicated tensors differ between ranks (equal within each group: " \
        "ranks 0, 1 | rank 2)" \
        in str(e.value.errors[0])


def test_one_rank_failing_before_the_save_fails_every_rank(tmp_path):
    def save(comm):
        w = torch.zeros(4, 4) if comm.rank == 0 else torch.zeros(4, 4).t()
        return ct.save({"w": w}, str(tmp_path), 1, process_group=comm)
    with pytest.raises(RanksFailed) as e:
        run_ranks(2, save)
    assert "not contiguous" in str(e.value.errors[1])
    assert "save: rank 1 failed" in str(e.value.errors[0])


def test_per_rank_values_on_fewer_and_more_ranks(tmp_path):
    def save(comm):
        return ct.save({"pos": ct.PerRank(100 + comm.rank),
                        "rng": ct.PerRank(torch.full((4,), comm.rank, dtype=torch.uint8))},
                       str(tmp_path), 1, process_group=comm)
    run_ranks(3, save)

    def load(comm):
        sd = {"pos": ct.PerRank(None), "rng": ct.PerRank(torch.zeros(4, dtype=torch.uint8))}
        report = ct.load(sd, str(tmp_path), process_group=comm)  # strict
        return sd, report
    (sd0, rep0), (sd1, _) = run_ranks(2, load)
    assert (sd0["pos"].value, sd1["pos"].value) == (100, 101)
    assert torch.equal(sd1["rng"].value, torch.ones(4, dtype=torch.uint8))
    assert sorted(rep0.not_loaded) == [
        ("pos@rank2", "saved by rank 2; no loading rank has rank 2"),
        ("rng@rank2", "saved by rank 2; no loading rank has rank 2")]

    with pytest.raises(RanksFailed) as e:
        run_ranks(4, load)
    assert isinstance(e.value.errors[3], KeyError)
    assert "entry 'pos': no value saved for rank 3 (saved on 3 ranks)" in str(e.value.errors[3])
    assert "load: rank 3 failed" in str(e.value.errors[0])


def test_strict_is_checked_over_the_union_of_the_ranks_requests(tmp_path):
    ct.save({"a": torch.ones(2), "b": torch.ones(2), "c": torch.ones(2)}, str(tmp_path), 1)

    def load(comm):  # rank 0 takes a, rank 1 takes b; nobody takes c
        return ct.load({"ab"[comm.rank]: torch.zeros(2)}, str(tmp_path), process_group=comm)
    with pytest.raises(RanksFailed) as e:
        run_ranks(2, load)
    assert "1 checkpoint entries requested by no rank: 'c'" in str(e.value.errors[0])

    def load_all(comm):
        sd = {"ab"[comm.rank]: torch.zeros(2)}
        if comm.rank == 1:
            sd["c"] = torch.zeros(2)
        return ct.load(sd, str(tmp_path), process_group=comm)
    run_ranks(2, load_all)


# FIELD-LESSONS 2: a model-only load into a job that keeps a CPU-side
# optimizer copy of the parameters.
def test_model_only_load_reports_every_destination_not_loaded(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    cpu_master = {n: p.detach().clone() for n, p in model.named_parameters()}
    ct.save({"model": model.state_dict(), "optim": ct.optimizer_state_dict(model, opt),
             "master": cpu_master}, str(tmp_path), 1)

    model2 = torch.nn.Linear(4, 3)
    opt2 = torch.optim.Adam(model2.parameters())
    master2 = {n: p.detach().clone() for n, p in model2.named_parameters()}
    sd = {"model": model2.state_dict(), "optim": ct.optimizer_state_dict(model2, opt2),
          "master": master2}
    # Accidental partial load (the state dict lacks the CPU copies): refused.
    with pytest.raises(ckpt.FailedPreconditionError, match="'master.bias', 'master.weight'"):
        ct.load({"model": sd["model"], "optim": sd["optim"]}, str(tmp_path))
    report = ct.load(sd, str(tmp_path), filter=lambda n: n.startswith("model."))
    skipped = {n for n, why in report.not_loaded if why == "excluded by filter"}
    assert skipped >= {"master.weight", "master.bias", "optim.state.weight.exp_avg",
                       "optim.state.weight.exp_avg_sq", "optim.state.weight.step",
                       "optim.state.bias.exp_avg", "optim.param_groups"}
    assert report.loaded == ["model.bias", "model.weight"]
    assert torch.equal(model2.weight, model.weight)


# FIELD-LESSONS 1: the forward pass uses a low-precision copy derived from
# fp32 master weights; a load must refresh it before the next step.
class MasterAndCopy:
    def __init__(self, seed):
        torch.manual_seed(seed)
        self.master = torch.nn.Linear(16, 1)
        self.opt = torch.optim.SGD(self.master.parameters(), lr=0.05)
        self.copy = {n: p.detach().to(torch.bfloat16) for n, p in self.master.named_parameters()}

    def refresh(self, name):
        self.copy[name].copy_(dict(self.master.named_parameters())[name].detach())

    def step(self, k):
        g = torch.Generator().manual_seed(k)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)
        w = {n: c.float().requires_grad_() for n, c in self.copy.items()}
        loss = ((x @ w["weight"].t() + w["bias"] - y) ** 2).mean()
        loss.backward()
        for n, p in self.master.named_parameters():
            p.grad = w[n].grad
        self.opt.step()
        for n in self.copy:
            self.refresh(n)
        return loss.item()

    def state(self):
        return {"model": self.master.state_dict()}


def test_completion_callback_refreshes_the_low_precision_copy(tmp_path):
    run = MasterAndCopy(seed=1)
    for k in range(3):
        run.step(k)
    ct.save(run.state(), str(tmp_path), 3)
    expected = run.step(3)

    resumed = MasterAndCopy(seed=2)  # different random init
    ct.load(resumed.state(), str(tmp_path),
            on_complete=lambda name: resumed.refresh(name.split(".", 1)[1]))
    assert resumed.step(3) == expected

    control = MasterAndCopy(seed=2)
    ct.load(control.state(), str(tmp_path))  # no callback: stale copy
    assert control.step(3) != expected


def test_save_async_keeps_the_values_at_the_call_while_tensors_change(tmp_path):
    root = str(tmp_path / "root")
    w = torch.arange(100000, dtype=torch.float32)
    b = torch.arange(10, dtype=torch.int64)
    state = {"w": w, "b": b, "step": 7}
    saved = {"w": w.clone(), "b": b.clone()}
    handle = ct.save_async(state, root, 7)
    # The trainer goes on at once, in place.
    w.mul_(-1)
    b.fill_(3)
    state["step"] = 8
    result = handle.wait()
    assert handle.done()
    assert result.path.endswith("step-00000007")
    assert result.stall_seconds > 0 and result.peak_staging_bytes > 0
    assert 0 < result.snapshot_seconds <= result.stall_seconds
    assert handle.wait().path == result.path  # idempotent
    out = {"w": torch.zeros_like(w), "b": torch.zeros_like(b), "step": None}
    ct.load(out, root)
    assert torch.equal(out["w"], saved["w"]) and torch.equal(out["b"], saved["b"])
    assert out["step"] == 7


def test_save_async_background_error_is_raised_by_wait_and_commits_nothing(tmp_path):
    root = str(tmp_path / "root")
    raw = torch.zeros(1000, dtype=torch.uint8)
    raw[17] = 2  # not a bool: found by the background writer, after the snapshot
    handle = ct.save_async({"mask": raw.view(torch.bool)}, root, 1)
    for _ in range(2):  # every wait() raises the same
        with pytest.raises(ckpt.InvalidArgumentError, match="element 17.*0x02"):
            handle.wait()
    assert handle.done()
    with pytest.raises(ckpt.NotFoundError):
        ckpt.Reader(root)
    # The next save is not affected.
    ct.save({"w": torch.ones(3)}, root, 2)
    assert ckpt.Reader(root).step == 2


def test_a_new_save_waits_for_the_save_async_in_flight(tmp_path):
    root = str(tmp_path / "root")
    first = ct.save_async({"w": torch.ones(50000)}, root, 1)
    ct.save({"w": torch.zeros(50000)}, root, 2)
    assert first.done()
    assert first.wait().path.endswith("step-00000001")
    second = ct.save_async({"w": torch.full((10,), 2.0)}, root, 3)
    third = ct.save_async({"w": torch.full((10,), 3.0)}, root, 4)
    assert second.done()
    third.wait()
    assert [ckpt.Reader(ckpt.step_path(root, s)).step for s in (1, 2, 3, 4)] == [1, 2, 3, 4]


def test_save_async_on_several_ranks_commits_in_wait(tmp_path):
    root = str(tmp_path / "root")

    def rank_fn(comm):
        rank = comm.rank
        t = torch.full((1000,), float(rank))
        handle = ct.save_async({"t": ct.Chunk(t, (2000,), flat_start=rank * 1000)}, root, 1,
                               process_group=comm)
        t.fill_(-1)
        handle.wait()
        out = torch.zeros(2000)
        ct.load({"t": out}, root, process_group=comm)
        assert torch.equal(out[:1000], torch.zeros(1000))
        assert torch.equal(out[1000:], torch.ones(1000))

    run_ranks(2, rank_fn)


def test_saves_of_one_group_reuse_their_writer_plan_and_staging_memory(tmp_path):
    root = str(tmp_path / "root")
    state = {"w": torch.arange(100000, dtype=torch.float32), "step": 1}
    first = ct.save_async(state, root, 1).wait()
    second = ct.save_async(state, root, 2).wait()
    assert not first.plan_cache_hit and second.plan_cache_hit
    assert second.staging_cap_bytes == first.staging_cap_bytes
    state["extra"] = torch.ones(3)  # a new structure: replanned, all saved
    third = ct.save(state, root, 3)
    assert not third.plan_cache_hit
    assert ckpt.Reader(root).find("extra") is not None
    # The kept Writer has the plan in memory; after release() a new one has
    # none (and is not allowed the plan recorded in the checkpoint here).
    assert ct.save_async(state, root, 4, reuse_recorded_plan=False).wait().plan_cache_hit
    ct.release()
    assert not ct.save_async(state, root, 5, reuse_recorded_plan=False).wait().plan_cache_hit
    ct.release()


def test_shard_is_the_deprecated_name_of_chunk():
    """ckpt.torch.Shard was renamed Chunk (DTensor's Shard is a placement);
    the old name still works, with a DeprecationWarning."""
    with pytest.warns(DeprecationWarning, match="ckpt.torch.Shard is now ckpt.torch.Chunk"):
        assert ct.Shard is ct.Chunk
    with pytest.raises(AttributeError, match="no attribute 'Shardd'"):
        ct.Shardd


def _trajectory(make_opt, save_at_start, tmp_path):
    """Parameters after 3 steps of a tiny regression; with save_at_start a
    ckpt save runs after the first backward, before the first step (the
    optimizer has no state yet, the gradients are real)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = make_opt(model.parameters())
    x, y = torch.randn(8, 4), torch.randn(8, 3)
    for step in range(3):
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        if save_at_start is not None and step == 0:
            save_at_start(model, opt)
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("make_opt,torch_init_differs", [
    (lambda ps: torch.optim.Adam(ps, lr=0.1, weight_decay=0.1), True),
    (lambda ps: torch.optim.AdamW(ps, lr=0.1), True),
    (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), False),  # zero momentum = none
], ids=["adam_l2", "adamw", "sgd_momentum"])
def test_saving_before_the_first_step_leaves_training_unchanged(tmp_path, make_opt,
                                                                 torch_init_differs):
    """The optimizer's state is made for the save as its first step would
    find it: the run that saved before its first step goes on bit for bit
    as the run that did not. Control: torch's own state initialisation
    (what dcp.save does through get_optimizer_state_dict) leaves step = 1
    and moments of the real gradients, and the runs differ."""
    plain = _trajectory(make_opt, None, tmp_path)
    saves = iter(range(10))

    def ckpt_save(model, opt):
        ct.save({"model": model, "optim": opt}, str(tmp_path / "a"), next(saves))

    def name_keyed_save(model, opt):
        ct.save({"optim": ct.optimizer_state_dict(model, opt)}, str(tmp_path / "b"),
                next(saves))
    for save in (ckpt_save, name_keyed_save):
        after = _trajectory(make_opt, save, tmp_path)
        assert all(torch.equal(a, b) for a, b in zip(plain, after)), save.__name__

    from torch.distributed.checkpoint.state_dict import _init_optim_state

    def torch_init(model, opt):
        grads = [p.grad for p in model.parameters()]
        for p in model.parameters():
            p.grad = None  # torch's init returns early when gradients exist
        _init_optim_state(opt)
        for p, g in zip(model.parameters(), grads):
            p.grad = g
    control = _trajectory(make_opt, torch_init, tmp_path)
    same = all(torch.equal(a, b) for a, b in zip(plain, control))
    assert same != torch_init_differs


def test_negative_bit_views_are_refused_naming_the_entry(tmp_path):
    """A negative-bit view (torch._neg_view(x); z.conj().imag is another,
    strided) is contiguous and real, but its memory holds x, not -x: saved
    as it is, it would be saved with the wrong sign (and loaded into with
    the wrong sign). Refused for save and load; resolve_neg() saves the
    right values (the control)."""
    neg = torch._neg_view(torch.arange(4.0))
    assert neg.is_neg() and neg.is_contiguous()
    with pytest.raises(ckpt.InvalidArgumentError, match=r"entry 'w': a negative-bit view"):
        ct.save({"w": neg}, str(tmp_path), 1)
    ct.save({"w": neg.resolve_neg()}, str(tmp_path), 2)
    back = {"w": torch.zeros(4)}
    ct.load(back, str(tmp_path))
    assert torch.equal(back["w"], -torch.arange(4.0))
    into = torch._neg_view(torch.zeros(4))
    with pytest.raises(ckpt.InvalidArgumentError, match=r"entry 'w': a negative-bit view"):
        ct.load({"w": into}, str(tmp_path))


def test_snapshot_to_device_without_cuda_tensors_is_an_ordinary_save_async(tmp_path):
    # The option reaches SaveOptions; with no CUDA tensor the group's Writer
    # needs no device memory (0 bytes), and the save is exact.
    assert ckpt.save_options(snapshot_to_device=True).snapshot_to_device is True
    assert ckpt.Writer(device_snapshot_bytes=1 << 20).device_snapshot_bytes == 1 << 20
    src = {"w": torch.arange(10, dtype=torch.float32), "step": 4}
    r = ct.save_async(src, str(tmp_path), 4, snapshot_to_device=True).wait()
    assert r.device_snapshot_bytes == 0
    out = {"w": torch.zeros(10), "step": None}
    ct.load(out, str(tmp_path))
    assert torch.equal(out["w"], src["w"]) and out["step"] == 4
    ct.release()


def test_save_async_staging_cap_grows_to_the_state_and_is_kept():
    # save_async never waits for writes: the group's Writer gets a staging
    # cap of at least the state's tensor bytes (a new Writer when it grows;
    # memory is allocated at the save, min(cap, bytes written), not here).
    from ckpt.torch import _save
    ct.release()
    first = _save._writer(None, None)
    assert first.staging_bytes == 4 << 30 and first.device_snapshot_bytes == 0
    assert _save._writer(None, None, 0, 1 << 20) is first  # fits: kept
    grown = _save._writer(None, None, 1 << 10, 5 << 30)
    assert grown is not first
    assert grown.staging_bytes == 5 << 30 and grown.device_snapshot_bytes == 1 << 10
    assert _save._writer(None, None) is grown  # a smaller need keeps it
    state = {"a": torch.zeros(3), "b": {"c": torch.zeros(2, 2)}, "v": 1}
    leaves = ct._leaves._flatten(state)
    assert _save._snapshot_sizes(leaves, to_device=True) == (28, 0)  # no CUDA tensor
    ct.release()
