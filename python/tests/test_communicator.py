"""Communicators' all_to_all (ckpt's AllToAll, the data plane of a
cooperative load): the adapter around Python objects calls their
all_to_all when they have one and falls back to all_gather otherwise; the
C++ communicators expose it; ckpt.torch.ProcessGroupCommunicator
implements it over gloo."""
import pytest

import ckpt
from conftest import ThreadRanks, require, run_ranks


def part(sender: int, receiver: int) -> bytes:
    """What `sender` sends to `receiver`: some empty, some with NUL."""
    return bytes((sender * 31 + receiver * 17 + i) % 256
                 for i in range((sender * 7 + receiver * 3) % 5 * 3))


def exchange(comm):
    """ckpt's AllToAll of part(me, d) to every d through `comm` (a Python
    object goes through the C++ adapter); checks what arrives."""
    got = ckpt._ckpt._all_to_all(comm, [part(comm.rank, d) for d in range(comm.size)])
    assert got == [part(s, comm.rank) for s in range(comm.size)]
    return got


class AllToAllRanks(ThreadRanks):
    """ThreadRanks with all_to_all, counting the calls of each method."""

    def __init__(self, rank, shared, lie_on=None):
        super().__init__(rank, shared)
        self.calls = {"all_to_all": 0, "all_gather": 0}
        self.lie_on = lie_on

    def all_gather(self, data):
        self.calls["all_gather"] += 1
        return super().all_gather(data)

    def all_to_all(self, parts):
        self.calls["all_to_all"] += 1
        everyone = self._exchange(list(parts))
        got = [everyone[s][self.rank] for s in range(self.size)]
        if self.rank == self.lie_on and self.calls["all_to_all"] == 2:
            got[0] += b"!"  # the bytes, not the sizes, come back too long
        return got


def with_all_to_all(size, fn, **kw):
    """run_ranks with AllToAllRanks instead of ThreadRanks."""
    return run_ranks(size, lambda comm: fn(AllToAllRanks(comm.rank, comm.shared, **kw)))


def test_python_all_to_all_is_called_when_the_object_has_one():
    def rank(comm):
        exchange(comm)
        return comm.calls
    for calls in with_all_to_all(3, rank):
        # The sizes, then the bytes; never the all_gather fallback.
        assert calls == {"all_to_all": 2, "all_gather": 0}


def test_without_all_to_all_the_default_goes_over_all_gather():
    class Counting(ThreadRanks):
        gathers = 0

        def all_gather(self, data):
            self.gathers += 1
            return super().all_gather(data)

    def rank(comm):
        c = Counting(comm.rank, comm.shared)
        exchange(c)
        return c.gathers
    assert all(g == 2 for g in run_ranks(3, rank))


def test_wrong_sizes_from_python_fail_every_rank_with_the_same_error():
    def rank(comm):
        with pytest.raises(ckpt.InvalidArgumentError) as e:
            exchange(comm)
        return str(e.value)
    messages = with_all_to_all(3, rank, lie_on=1)
    expected = f"AllToAll: rank 0 sends {len(part(0, 1)) + 1} bytes to rank 1, which expects"
    assert all(expected in m for m in messages), messages
    assert len(set(messages)) == 1


def test_wrong_number_of_parts_on_one_rank_fails_every_rank():
    def rank(comm):
        parts = [b"x"] * (2 if comm.rank == 2 else 3)
        with pytest.raises(ckpt.InvalidArgumentError, match="AllToAll on rank 2: expected 3"):
            ckpt._ckpt._all_to_all(comm, parts)
        return comm.calls["all_to_all"]
    # Agreed before any Python all_to_all: nobody enters one.
    assert with_all_to_all(3, rank) == [0, 0, 0]


def test_an_exception_in_all_to_all_fails_every_rank_with_the_lowest_ranks():
    class Raising(AllToAllRanks):
        def all_to_all(self, parts):
            raise RuntimeError(f"network down on rank {self.rank}")

    def rank(comm):
        with pytest.raises(ckpt.InternalError, match="all_to_all.*network down on rank 0"):
            exchange(Raising(comm.rank, comm.shared))
    run_ranks(3, rank)


def test_cpp_communicators_expose_all_to_all():
    comm = ckpt.SingleProcessCommunicator()
    assert comm.all_to_all([b"abc\0"]) == [b"abc\0"]
    assert comm.all_to_all([b""]) == [b""]
    with pytest.raises(ckpt.InvalidArgumentError, match="expected 1 send"):
        comm.all_to_all([b"a", b"b"])


def gloo_ranks(rank, world, store):
    import torch.distributed as dist
    import ckpt.torch as ct
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    comm = ct.ProcessGroupCommunicator()
    # Directly, then as ckpt's AllToAll through the C++ adapter.
    got = comm.all_to_all([part(rank, d) for d in range(world)])
    assert got == [part(s, rank) for s in range(world)], got
    exchange(comm)
    empty = comm.all_to_all([b""] * world)
    assert empty == [b""] * world
    big = comm.all_to_all([bytes([rank, d]) * 100000 for d in range(world)])
    assert big == [bytes([s, rank]) * 100000 for s in range(world)]
    # all_to_all_into (what ckpt's AllToAll uses): parts back to back each
    # way, received in place; a rank expecting other sizes still completes
    # the collective, then raises (the others do not).
    parts = [part(rank, d) * (d + 1) for d in range(world)]
    sizes = [len(part(s, rank) * (rank + 1)) for s in range(world)]
    recv = bytearray(sum(sizes))
    comm.all_to_all_into(memoryview(bytearray(b"".join(parts))), [len(p) for p in parts],
                         memoryview(recv), sizes)
    assert bytes(recv) == b"".join(part(s, rank) * (rank + 1) for s in range(world))
    wrong = list(sizes)
    if rank == 0:
        wrong[1] += 1
    try:
        comm.all_to_all_into(memoryview(bytearray(b"".join(parts))), [len(p) for p in parts],
                             memoryview(bytearray(sum(wrong))), wrong)
        assert rank != 0, "rank 0 expected other sizes"
    except ckpt.InvalidArgumentError as e:
        assert rank == 0 and "rank 1 sent" in str(e), e
    # all_gather and broadcast: lengths travel with the first 4088 bytes;
    # longer messages take a second collective (sizes around the edge).
    for n in (0, 1, 4087, 4088, 4089, 100000):
        mine = bytes([rank + 1]) * (n + rank)
        assert comm.all_gather(mine) == [bytes([s + 1]) * (n + s) for s in range(world)], n
        sent = bytes(range(256)) * (n // 256) + b"x" * (n % 256)
        assert comm.broadcast(sent if rank == 1 else b"", 1) == sent, n
    dist.barrier()
    # torch 2.x aborts at exit ("terminate called without an active
    # exception") when a gloo group is left for the interpreter to destroy.
    dist.destroy_process_group()


def test_process_group_communicator_all_to_all_over_gloo(tmp_path):
    # Forked ranks inherit torch and ckpt.torch, imported here once: a
    # spawned rank spends seconds importing them (test_training.py).
    torch = require("torch")
    require("torch.distributed")
    require("ckpt.torch")
    torch.multiprocessing.start_processes(gloo_ranks, args=(3, str(tmp_path / "store")),
                                          nprocs=3, join=True, start_method="fork")
