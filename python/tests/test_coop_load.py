"""Cooperative loads from Python: ckpt.Reader(comm=...) and
ckpt.torch.load(process_group=...) read each stored block once between the
ranks (ckpt/reader.h, "Cooperative loads"); LoadReport.bytes_received."""
import os

import numpy as np
import pytest

import ckpt
from conftest import RanksFailed, require, run_ranks

ROWS, COLS = 64, 48


def global_array(i):
    return (np.arange(ROWS * COLS, dtype=np.float32) * (i + 1)).reshape(ROWS, COLS)


def save_rows(root, world=4):
    """`world` ranks save row bands of two tensors."""
    def rank(comm):
        w = ckpt.Writer(comm)
        band = ROWS // world
        keep = []
        for i in range(2):
            piece = np.ascontiguousarray(global_array(i)[comm.rank * band:(comm.rank + 1) * band])
            keep.append(piece)
            w.add_tensor(f"t{i}", ckpt.float32, (ROWS, COLS),
                         ckpt.Box((comm.rank * band, 0), (band, COLS)), piece)
        return w.save(root, 1, ckpt.save_options(block_size=4096)).stored_bytes
    return run_ranks(world, rank)[0]


def test_reader_with_a_communicator_reads_each_block_once(tmp_path):
    root = str(tmp_path)
    stored = save_rows(root)

    def rank(comm):  # 2 ranks, columns: every stored block feeds both
        r = ckpt.Reader(root, comm=comm)
        c = COLS // 2
        out = {}
        # Ranks that can map each other's shared memory exchange through it
        # (the default); shared_memory_exchange=False: through all_to_all.
        for shared in (True, False):
            outs = [np.zeros((ROWS, c), np.float32) for _ in range(2)]
            reqs = [ckpt.LoadRequest(f"t{i}", ckpt.float32, (ROWS, COLS),
                                     ckpt.Box((0, comm.rank * c), (ROWS, c)), outs[i])
                    for i in range(2)]
            report = r.load(reqs, exchange_bytes_per_round=4096,
                            shared_memory_exchange=shared)
            for i in range(2):
                assert np.array_equal(outs[i],
                                      global_array(i)[:, comm.rank * c:(comm.rank + 1) * c])
            assert report.shared_memory_exchange == shared
            out[shared] = report.bytes_read, report.bytes_received
        return out
    got = run_ranks(2, rank)
    for shared in (True, False):
        assert sum(g[shared][0] for g in got) == stored  # every block once
        assert all(0 < g[shared][1] < stored for g in got)
        assert [g[shared] for g in got] == [g[True] for g in got]
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"ckpt-coop-{os.getpid()}-")]


class NamedNodeRanks:
    """A ThreadRanks that reports a node name (here a method; an attribute
    works as well)."""

    def __init__(self, comm, node):
        self._comm, self._node = comm, node
        self.rank, self.size = comm.rank, comm.size
        for m in ("all_gather", "broadcast", "barrier", "all_reduce_max"):
            setattr(self, m, getattr(comm, m))

    def node_name(self):
        return self._node


def test_reads_spread_over_the_nodes_python_communicators_name(tmp_path):
    root = str(tmp_path)
    stored = save_rows(root)

    def rank(comm):  # ranks 0-2 on node "a", rank 3 on "b"; all want all
        named = NamedNodeRanks(comm, "b" if comm.rank == 3 else "a")
        r = ckpt.Reader(root, comm=named)
        outs = [np.zeros((ROWS, COLS), np.float32) for _ in range(2)]
        report = r.load([ckpt.LoadRequest(f"t{i}", ckpt.float32, (ROWS, COLS), None, outs[i])
                         for i in range(2)])
        for i in range(2):
            assert np.array_equal(outs[i], global_array(i))
        return report.bytes_read
    got = run_ranks(4, rank)
    assert sum(got) == stored
    assert abs(got[3] - stored / 2) <= 4096  # node "b" reads half, within a block


def test_a_node_name_that_is_not_a_str_is_refused(tmp_path):
    root = str(tmp_path)
    save_rows(root, world=1)

    class BadNode(NamedNodeRanks):
        def node_name(self):
            return 7
    def rank(comm):
        with pytest.raises(ckpt.InvalidArgumentError, match="node_name of a BadNode is a int"):
            ckpt.Reader(root, comm=BadNode(comm, ""))
    run_ranks(1, rank)
    assert ckpt.SingleProcessCommunicator().node_name == ""


def test_a_bad_request_on_one_rank_fails_every_rank(tmp_path):
    root = str(tmp_path)
    save_rows(root)

    def rank(comm):
        r = ckpt.Reader(root, comm=comm)
        dtype = ckpt.int32 if comm.rank == 1 else ckpt.float32
        out = np.zeros((ROWS, COLS), np.int32 if comm.rank == 1 else np.float32)
        r.load([ckpt.LoadRequest("t0", dtype, (ROWS, COLS), None, out)],
               allow_unrequested=True)
    with pytest.raises(RanksFailed) as e:
        run_ranks(2, rank)
    messages = {str(err) for err in e.value.errors}
    assert len(messages) == 1, messages
    assert "rank 1 of 2: t0: dtype float32 in checkpoint, int32 requested" in messages.pop()
    assert all(isinstance(err, ckpt.InvalidArgumentError) for err in e.value.errors)


def test_a_buffer_the_binding_refuses_on_one_rank_fails_every_rank(tmp_path):
    root = str(tmp_path)
    save_rows(root)

    def rank(comm):
        r = ckpt.Reader(root, comm=comm)
        rows = ROWS - 1 if comm.rank == 0 else ROWS  # too small on rank 0
        out = np.zeros((rows, COLS), np.float32)
        r.load([ckpt.LoadRequest("t0", ckpt.float32, (ROWS, COLS), None, out)],
               allow_unrequested=True)
    with pytest.raises(RanksFailed) as e:
        run_ranks(2, rank)
    messages = {str(err) for err in e.value.errors}
    assert len(messages) == 1, messages
    assert "rank 0 of 2: entry 't0': the buffer holds" in messages.pop()


def gloo_load(rank, world, store, root, stored, out):
    import torch
    import torch.distributed as dist
    import ckpt.torch as ct
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    # Replicas: every rank wants both whole tensors.
    state = {f"t{i}": torch.zeros(ROWS, COLS) for i in range(2)}
    report = ct.load(state, root)
    for i in range(2):
        assert torch.equal(state[f"t{i}"], torch.from_numpy(global_array(i)))
    import socket
    assert ct.ProcessGroupCommunicator().node_name == socket.gethostname()
    assert report.shared_memory_exchange  # processes of one machine
    reads = torch.tensor([report.bytes_read, report.bytes_received], dtype=torch.int64)
    dist.all_reduce(reads)
    if rank == 0:
        with open(out, "w") as f:
            f.write(f"{int(reads[0])} {int(reads[1])}")
    dist.barrier()
    # torch 2.x aborts at exit ("terminate called without an active
    # exception") when a gloo group is left for the interpreter to destroy.
    dist.destroy_process_group()


def test_torch_load_over_gloo_is_cooperative(tmp_path):
    torch = require("torch")
    root = str(tmp_path / "ckpt")
    stored = save_rows(root)
    out = str(tmp_path / "reads")
    # Forked ranks inherit torch and ckpt.torch, imported here once
    # (test_training.py).
    require("torch.distributed")
    require("ckpt.torch")
    torch.multiprocessing.start_processes(gloo_load,
                                          args=(2, str(tmp_path / "store"), root, stored, out),
                                          nprocs=2, join=True, start_method="fork")
    read, received = map(int, open(out).read().split())
    assert read == stored  # the replicas read the checkpoint once between them
    assert received == stored  # each rank got the half the other read
