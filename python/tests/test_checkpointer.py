"""ckpt.torch.Checkpointer: the checkpoints of one run, with the Writer (its
staging memory and save plan) owned by the object."""
import os

import pytest

import ckpt
from conftest import require, run_ranks

torch = require("torch")
ct = require("ckpt.torch")


def _state(seed: int):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g),
            "step": seed}


def _zeros():
    return {"w": torch.zeros(64, 32), "b": torch.zeros(32), "step": None}


def test_save_then_load_restores_every_value(tmp_path):
    saved = _state(1)
    with ct.Checkpointer(tmp_path) as c:
        c.save(saved, 10)
        back = _zeros()
        report = c.load(back)
    assert torch.equal(back["w"], saved["w"]) and torch.equal(back["b"], saved["b"])
    assert back["step"] == 1
    assert report.not_loaded == []
    # Control: a different state really differs.
    assert not torch.equal(_state(2)["w"], saved["w"])


def test_the_writer_is_made_once_and_reused(tmp_path):
    c = ct.Checkpointer(tmp_path)
    c.save(_state(1), 1)
    writer = c._writer
    c.save(_state(2), 2)
    c.save_async(_state(3), 3).wait()
    assert c._writer is writer
    c.close()
    assert c._writer is None


def test_steps_latest_and_keep_last(tmp_path):
    c = ct.Checkpointer(tmp_path, keep_last=2)
    assert c.steps() == [] and c.latest_step() is None
    for step in (5, 6, 7):
        c.save(_state(step), step)
    assert c.steps() == [6, 7]
    assert c.latest_step() == 7
    back = _zeros()
    c.load(back, step=6)
    assert back["step"] == 6
    # A step directory without its manifest is not a committed checkpoint.
    os.makedirs(tmp_path / "step-00000009")
    assert c.steps() == [6, 7]
    c.close()


def test_save_options_per_call_override_the_checkpointers(tmp_path):
    zeros = {"z": torch.zeros(1 << 16)}
    c = ct.Checkpointer(tmp_path, codec="zstd")
    packed = c.save(zeros, 1)
    plain = c.save(zeros, 2, codec="none")
    assert packed.stored_bytes < plain.stored_bytes / 10, (packed.stored_bytes,
                                                          plain.stored_bytes)
    c.close()


def test_save_async_snapshots_and_the_next_save_waits_for_it(tmp_path):
    c = ct.Checkpointer(tmp_path)
    state = _state(1)
    expected = state["w"].clone()
    handle = c.save_async(state, 1)
    state["w"].add_(1.0)  # the trainer goes on at once
    c.save(state, 2)      # waits for step 1 first
    assert handle.done()
    assert handle.wait().path.endswith("step-00000001")
    back = _zeros()
    c.load(back, step=1)
    assert torch.equal(back["w"], expected)
    c.load(back, step=2)
    assert torch.equal(back["w"], expected + 1.0)
    c.close()


def test_close_waits_and_a_closed_checkpointer_refuses_use(tmp_path):
    c = ct.Checkpointer(tmp_path)
    handle = c.save_async(_state(1), 1)
    c.close()
    assert handle.done()
    assert c.steps() == [1]
    c.close()  # idempotent
    for call in (lambda: c.save(_state(2), 2), lambda: c.load(_zeros())):
        with pytest.raises(ckpt.FailedPreconditionError, match="is closed"):
            call()


def test_a_failed_save_async_is_reported_by_its_handle_and_the_next_save_runs(tmp_path):
    c = ct.Checkpointer(tmp_path)
    c.save(_state(1), 1)
    with pytest.raises(ckpt.AlreadyExistsError):
        c.save(_state(1), 1)  # the step exists and overwrite is off
    c.save(_state(2), 2)
    assert c.steps() == [1, 2]
    c.close()


def test_two_ranks_save_and_load_resharded(tmp_path):
    full = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)

    def rank(comm):
        c = ct.Checkpointer(tmp_path, process_group=comm)
        r = comm.rank
        c.save({"w": ct.Chunk(full[4 * r:4 * r + 4].clone(), (8, 6), offsets=(4 * r, 0))}, 3)
        cols = torch.zeros(8, 3)
        c.load({"w": ct.Chunk(cols, (8, 6), offsets=(0, 3 * r))})
        c.close()
        return cols

    out = run_ranks(2, rank)
    assert torch.equal(torch.cat(out, dim=1), full)


def test_the_handle_is_a_future(tmp_path):
    """result(timeout), done() and exception() as concurrent.futures has them."""
    c = ct.Checkpointer(tmp_path)
    handle = c.save_async(_state(1), 1)
    assert handle.result(timeout=60).path.endswith("step-00000001")
    assert handle.done() and handle.exception() is None
    c.close()
    # A save that fails in the background: its step's directory is taken by
    # a plain file, so the commit cannot rename onto it.
    c = ct.Checkpointer(tmp_path / "b")
    os.makedirs(tmp_path / "b")
    open(tmp_path / "b" / "step-00000002", "w").close()
    try:
        handle = c.save_async(_state(2), 2)
    except ckpt.Error as e:  # refused before the snapshot: also a valid outcome
        assert "step-00000002" in str(e)
    else:
        err = handle.exception(timeout=60)
        assert isinstance(err, ckpt.Error) and "step-00000002" in str(err), err
        with pytest.raises(type(err)):
            handle.result()
    c.close()
