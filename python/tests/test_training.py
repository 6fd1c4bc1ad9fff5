"""Real training jobs save and resume through ckpt.torch: ranks are
processes forked by torch.multiprocessing (start method fork), talking
over gloo. A forked rank inherits this process's imported torch and ckpt,
so it starts in well under a second instead of the ~5 s a spawned one
spends importing them on two busy cores (15 ranks here: most of this
file's time with spawn). This process never initialises torch.distributed
nor runs a torch operation, and holds no ckpt Writer or Reader while it
forks."""
import json
import os
import subprocess

import pytest

from conftest import require, tool

torch = require("torch")
import ckpt  # noqa: E402

K, M = 3, 3  # save after step K, compare steps K+1..K+M


def spawn(fn, world, tmp_path, *args):
    """fn(rank, world, store, *args) on `world` forked processes."""
    store = tmp_path / f"store-{fn.__name__}-{world}-{len(os.listdir(tmp_path))}"
    torch.multiprocessing.start_processes(fn, args=(world, str(store)) + args, nprocs=world,
                                          join=True, start_method="fork")


def read(tmp_path, name, rank):
    with open(tmp_path / "out" / f"{name}-{rank}.json") as f:
        return json.load(f)


@pytest.fixture
def dirs(tmp_path):
    (tmp_path / "out").mkdir()
    return str(tmp_path / "root"), str(tmp_path / "out")


def test_ddp_adam_resume_is_bit_identical_and_tools_read_it(tmp_path, dirs):
    import training
    root, out = dirs
    spawn(training.uninterrupted, 2, tmp_path, root, out, False, K, M)
    spawn(training.resume, 2, tmp_path, root, out, False, M)
    for rank in range(2):
        assert read(tmp_path, "resumed", rank) == read(tmp_path, "losses", rank)

    r = ckpt.Reader(root)
    assert r.world_size == 2 and r.step == K
    assert r.find("data.position@rank1").kind == "object"
    assert r.find("optim.state.module.head.weight.exp_avg").dtype == ckpt.float32
    assert r.find("lowp").dtype == ckpt.bfloat16
    # DDP replicas are written once, by one of the ranks.
    assert all(len(e.chunks) == 1 for e in r.entries())
    assert {e.chunks[0][1] for e in r.entries() if e.name.startswith("model.")} == {0, 1}
    # Every C++ tool reads what Python wrote.
    subprocess.run([tool("ckpt-validate"), root], check=True, stdout=subprocess.DEVNULL)
    one = str(tmp_path / "one-rank")
    subprocess.run([tool("ckpt-reshard"), root, one, "--from", "2", "--to", "1"], check=True,
                   stdout=subprocess.DEVNULL)
    diff = subprocess.run([tool("ckpt-diff"), root, one], capture_output=True, text=True)
    assert diff.returncode == 0 and "equal" in diff.stdout, diff.stdout + diff.stderr


def test_async_saves_every_few_steps_resume_bit_identically(tmp_path, dirs):
    import training
    root, out = dirs
    k, every = 3 * 2, 2  # saves at steps 2, 4, 6; the last is in flight for M steps
    spawn(training.async_uninterrupted, 2, tmp_path, root, out, k, every, M)
    for rank in range(2):
        assert read(tmp_path, "committed", rank) == [2, 4, 6]
    assert ckpt.Reader(root).step == k
    spawn(training.resume, 2, tmp_path, root, out, False, M)
    for rank in range(2):
        assert read(tmp_path, "resumed", rank) == read(tmp_path, "losses", rank)


def test_zero_redundancy_optimizer_resumes_and_reshards(tmp_path, dirs):
    import training
    root, out = dirs
    spawn(training.uninterrupted, 2, tmp_path, root, out, True, K, M)
    # Each rank saved only the optimizer partition it owns.
    r = ckpt.Reader(root)
    shards = {e.name: {s for _, s in e.chunks} for e in r.entries()
              if e.name.startswith("optim.state.")}
    assert shards and all(len(s) == 1 for s in shards.values())
    assert set().union(*shards.values()) == {0, 1}
    n_model = sum(1 for e in r.entries() if e.name.startswith("model."))
    del r  # not held while ranks are forked

    spawn(training.resume, 2, tmp_path, root, out, True, M)
    for rank in range(2):
        assert read(tmp_path, "resumed", rank) == read(tmp_path, "losses", rank)

    for world in (1, 3):
        spawn(training.reshard_check, world, tmp_path, root, out, 2, 2)
        compared = 0
        for rank in range(world):
            got = read(tmp_path, f"reshard{world}", rank)
            assert got["mismatched"] == [], (world, rank)
            assert all(loss == loss and loss < 10 for loss in got["losses"])
            compared += got["compared"]
        # Every optimizer tensor was compared on exactly one rank.
        assert compared == world * n_model + len(shards)
