"""A kept Writer keeps what the last save registered the same way
(ckpt/torch/_registry.py): each way a tensor can change between saves
gets it registered again, and every checkpoint holds the values at its
call."""
import os

import pytest

torch = pytest.importorskip("torch")

import ckpt  # noqa: E402
import ckpt.torch as ct  # noqa: E402
from ckpt.torch import _save  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_writers():
    ct.release()
    yield
    ct.release()


class _Counting:
    """Counts the Writer's add_tensor calls (every Writer of the test)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = _save._KeptWriter.add_tensor

        def counted(writer, *args, **kwargs):
            self.calls += 1
            return real(writer, *args, **kwargs)
        monkeypatch.setattr(_save._KeptWriter, "add_tensor", counted, raising=False)


def _load(root, step, like):
    out = {k: torch.zeros_like(v) for k, v in like.items()}
    ct.load(out, root, step=step)
    return out


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))


def _save_with(via, use_async, sd, root, step):
    if via == "dcp":
        _dcp_save(use_async, sd, root, step)
    elif use_async:
        ct.save_async(sd, root, step).wait()
    else:
        ct.save(sd, root, step)


@pytest.mark.parametrize("via", ["ckpt.torch", "dcp"])
@pytest.mark.parametrize("use_async", [False, True])
def test_a_second_save_of_the_same_state_registers_nothing_again_and_holds_the_new_values(
        tmp_path, monkeypatch, use_async, via):
    m = _model()
    counting = _Counting(monkeypatch)
    saved = {}
    for step in (1, 2, 3):
        sd = m.state_dict()  # new detached tensor objects each time, same memory
        _save_with(via, use_async, sd, str(tmp_path), step)
        saved[step] = {k: v.clone() for k, v in sd.items()}
        with torch.no_grad():
            for p in m.parameters():
                p.add_(1.0)  # in place: the same memory, new values
    assert counting.calls == len(saved[1])  # the first save only
    for step, want in saved.items():
        got = _load(str(tmp_path), step, want)
        for k in want:
            assert torch.equal(got[k], want[k]), (step, k)


def test_a_tensor_set_to_new_memory_is_registered_again(tmp_path):
    t = torch.arange(6.0)
    sd = {"w": t}
    ct.save(sd, str(tmp_path), 1)
    t.set_(torch.full((6,), 7.0))  # the same tensor object, other memory
    ct.save(sd, str(tmp_path), 2)
    t.data = torch.full((6,), 9.0)
    ct.save(sd, str(tmp_path), 3)
    sd["w"] = torch.full((6,), 11.0)  # another tensor under the name
    ct.save(sd, str(tmp_path), 4)
    for step, value in ((1, None), (2, 7.0), (3, 9.0), (4, 11.0)):
        got = _load(str(tmp_path), step, {"w": torch.zeros(6)})["w"]
        want = torch.arange(6.0) if value is None else torch.full((6,), value)
        assert torch.equal(got, want), step


def test_a_view_of_the_same_memory_with_another_shape_or_dtype_is_registered_again(tmp_path):
    base = torch.arange(12, dtype=torch.float32)
    ct.save({"w": base}, str(tmp_path), 1)
    ct.save({"w": base.view(3, 4)}, str(tmp_path), 2)
    ct.save({"w": base.view(torch.int32)}, str(tmp_path), 3)
    assert tuple(ckpt.Reader(ckpt.step_path(str(tmp_path), 2)).find("w").shape) == (3, 4)
    assert ckpt.Reader(ckpt.step_path(str(tmp_path), 3)).find("w").dtype == ckpt.int32
    got = _load(str(tmp_path), 3, {"w": torch.zeros(12, dtype=torch.int32)})["w"]
    assert torch.equal(got, base.view(torch.int32))


def test_a_negative_bit_view_of_registered_memory_is_refused(tmp_path):
    t = torch.arange(4.0)
    ct.save({"w": t}, str(tmp_path), 1)
    neg = torch._neg_view(t)  # the same address, shape and dtype
    with pytest.raises(ckpt.InvalidArgumentError, match="entry 'w'.*negative-bit"):
        ct.save({"w": neg}, str(tmp_path), 2)
    ct.save({"w": t}, str(tmp_path), 3)  # the failed save left nothing behind
    assert torch.equal(_load(str(tmp_path), 3, {"w": t})["w"], t)


def test_entries_the_state_no_longer_has_are_not_saved(tmp_path):
    sd = {"a": torch.ones(3), "b": torch.zeros(2), "step": 5}
    ct.save(sd, str(tmp_path), 1)
    del sd["b"], sd["step"]
    ct.save(sd, str(tmp_path), 2)
    assert ckpt.Reader(ckpt.step_path(str(tmp_path), 2)).entry_names() == ["a"]


def test_a_name_that_changes_between_tensor_and_value_is_saved_as_it_is_now(tmp_path):
    ct.save({"x": torch.ones(2)}, str(tmp_path), 1)
    ct.save({"x": 42}, str(tmp_path), 2)
    ct.save({"x": torch.full((2,), 3.0)}, str(tmp_path), 3)
    state = {"x": 0}
    ct.load(state, str(tmp_path), step=2)
    assert state["x"] == 42
    assert torch.equal(_load(str(tmp_path), 3, {"x": torch.zeros(2)})["x"],
                       torch.full((2,), 3.0))


def test_a_save_that_fails_leaves_the_next_save_complete(tmp_path):
    sd = {"a": torch.ones(3), "b": torch.arange(4.0)}
    ct.save(sd, str(tmp_path), 1)
    with pytest.raises(TypeError, match="entry 'bad'"):
        ct.save({**sd, "bad": object()}, str(tmp_path), 2)
    ct.save(sd, str(tmp_path), 3)
    got = _load(str(tmp_path), 3, sd)
    assert all(torch.equal(got[k], sd[k]) for k in sd)


def test_verify_replicas_registers_every_tensor_again(tmp_path, monkeypatch):
    sd = {"a": torch.ones(3), "b": torch.arange(4.0)}
    ct.save(sd, str(tmp_path), 1)
    counting = _Counting(monkeypatch)
    ct.save(sd, str(tmp_path), 2, verify_replicas=True)
    assert counting.calls == 2


def test_the_checkpointer_keeps_registrations_too(tmp_path, monkeypatch):
    m = _model()
    c = ct.Checkpointer(str(tmp_path))
    counting = _Counting(monkeypatch)
    for step in (1, 2):
        c.save_async(m.state_dict(), step).wait()
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(2.0)
    assert counting.calls == len(m.state_dict())
    c.close()


def _two_ranks(rank, world, root, out):
    from torch.distributed.tensor import DeviceMesh, Shard, distribute_tensor
    mesh = DeviceMesh("cpu", list(range(world)))
    d = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
    ct.save({"x": torch.ones(2), "d": d}, root, 1)
    with torch.no_grad():
        d.to_local().add_(100.0)  # in place: the kept DTensor registration
    ct.save({"x": 7, "d": d.detach()}, root, 2)  # rank 0 sets x; rank 1 drops its tensor
    ct.save({"x": torch.full((2,), 3.0), "d": d}, root, 3)
    got = {"x": 0, "d": distribute_tensor(torch.zeros(8), mesh, [Shard(0)])}
    ct.load(got, root, step=2)
    assert got["x"] == 7
    assert torch.equal(got["d"].full_tensor(), torch.arange(8.0) + 100)
    x = torch.zeros(2)
    ct.load({"x": x}, root, step=3, strict=False)
    assert torch.equal(x, torch.full((2,), 3.0))
    with open(os.path.join(out, f"ok-{rank}"), "w"):
        pass


def test_ranks_keep_dtensor_registrations_and_drop_a_tensor_that_became_a_value(tmp_path):
    from test_torch2 import run
    root, out = str(tmp_path / "root"), tmp_path / "out"
    out.mkdir()
    run(_two_ranks, 2, tmp_path, root, str(out))
    assert sorted(os.listdir(out)) == ["ok-0", "ok-1"]


def test_a_state_of_new_tensors_is_registered_anew_without_removing_each(tmp_path, monkeypatch):
    """Writer.remove is linear in the entries: a save whose tensors all
    moved (a copy of the state per save, as CPU offloading makes) clears
    the Writer instead of removing 200 entries one by one."""
    names = [f"t{i}" for i in range(200)]
    removed = []
    real = _save._KeptWriter.remove
    monkeypatch.setattr(_save._KeptWriter, "remove",
                        lambda w, n: (removed.append(n), real(w, n))[1], raising=False)
    for step in (1, 2, 3):
        sd = {n: torch.full((4,), float(step)) for n in names}  # new memory each save
        ct.save(sd, str(tmp_path), step)
    assert removed == []
    got = _load(str(tmp_path), 3, {n: torch.zeros(4) for n in names})
    assert all(torch.equal(t, torch.full((4,), 3.0)) for t in got.values())


# --- through DCP's API (ckpt.torch.dcp.Writer) ------------------------------------

def _dcp_save(use_async, sd, root, step):
    import torch.distributed.checkpoint as dcp
    import ckpt.torch.dcp as ckdcp
    writer = ckdcp.Writer(root, step=step)
    if use_async:
        dcp.async_save(sd, storage_writer=writer).result()
    else:
        dcp.save(sd, storage_writer=writer)


def _dcp_load(root, step, like):
    import torch.distributed.checkpoint as dcp
    import ckpt.torch.dcp as ckdcp
    out = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else v for k, v in like.items()}
    dcp.load(out, storage_reader=ckdcp.Reader(root, step=step))
    return out


@pytest.mark.parametrize("use_async", [False, True])
def test_dcp_saves_register_what_changed_and_drop_what_went(tmp_path, monkeypatch, use_async):
    """New memory under a name, a name gone, a tensor that became a Python
    value and back, a non-contiguous tensor (copied per save: never kept)."""
    root = str(tmp_path)
    base = torch.arange(12.0)
    sd = {"a": torch.ones(3), "b": torch.zeros(2), "t": base.view(3, 4).t(), "x": torch.ones(2)}
    _dcp_save(use_async, sd, root, 1)
    counting = _Counting(monkeypatch)
    base.add_(1.0)
    sd = {"a": torch.full((3,), 5.0), "t": base.view(3, 4).t(), "x": 7}
    _dcp_save(use_async, sd, root, 2)
    assert counting.calls == 2  # "a" (new memory) and "t" (copied, not kept)
    r = ckpt.Reader(ckpt.step_path(root, 2))
    assert r.entry_names() == ["a", "t", "x"]
    got = _dcp_load(root, 2, {"a": torch.zeros(3), "t": torch.zeros(4, 3), "x": 0})
    assert torch.equal(got["a"], sd["a"]) and torch.equal(got["t"], sd["t"]) and got["x"] == 7
    sd["x"] = torch.full((2,), 3.0)
    _dcp_save(use_async, sd, root, 3)
    assert torch.equal(_dcp_load(root, 3, {"x": torch.zeros(2)})["x"], sd["x"])


def test_a_failed_dcp_save_leaves_the_next_complete_and_release_frees_the_writers(tmp_path):
    """A save failing part way through registering ("a" kept, then a name
    ckpt refuses) clears the Writer: the next save registers everything."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    import ckpt.torch.dcp as ckdcp
    root = str(tmp_path)
    sd = {"a": torch.ones(3), "b": torch.arange(4.0)}
    _dcp_save(True, sd, root, 1)
    bad = {"a": sd["a"], "../bad": torch.ones(2), "b": sd["b"]}  # a name ckpt refuses
    with pytest.raises(ckpt.InvalidArgumentError, match="'../bad'"):
        _dcp_save(True, bad, root, 2)
    with pytest.raises(CheckpointException, match="'../bad'"):
        dcp.save(bad, storage_writer=ckdcp.Writer(root, step=2))
    sd["a"].add_(1.0)
    _dcp_save(True, sd, root, 3)
    got = _dcp_load(root, 3, sd)
    assert all(torch.equal(got[k], sd[k]) for k in sd)
    assert ckpt.Reader(ckpt.step_path(root, 3)).entry_names() == ["a", "b"]
    assert ckdcp._writers
    ct.release()
    assert not ckdcp._writers
