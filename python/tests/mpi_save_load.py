"""ctest python.mpi_communicator: ckpt.MpiCommunicator from an mpi4py
communicator, under `mpirun -np 2`: its all_to_all, then a two-rank save of
flat-range pieces through the core Writer and through ckpt.torch, loaded
back resharded.
Exits non-zero on any failure; outside CI a missing mpi4py skips the test
(exit 77) and a missing torch the ckpt.torch part.
Usage: mpirun -np 2 python3 mpi_save_load.py ROOT"""
import os
import shutil
import sys

import numpy as np

import ckpt

try:
    from mpi4py import MPI
except ImportError:
    if os.environ.get("CI") == "true":
        raise
    print("mpi4py is not installed: skipped")
    sys.exit(77)  # ctest SKIP_RETURN_CODE

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
root = sys.argv[1]
if rank == 0:
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
world.Barrier()

comm = ckpt.MpiCommunicator(world)
assert (comm.rank, comm.size) == (rank, size)
# all_to_all (MPI_Alltoallv underneath): parts of different sizes, one empty.
got = comm.all_to_all([bytes([rank, d]) * (3 * d + rank) for d in range(size)])
assert got == [bytes([s, rank]) * (3 * rank + s) for s in range(size)], got
full = np.arange(100, dtype=np.float64)
cuts = np.linspace(0, 100, size + 1).astype(int)
piece = full[cuts[rank]:cuts[rank + 1]].copy()
w = ckpt.Writer(comm)
w.add_tensor("w", ckpt.float64, (100,), ckpt.FlatRange(int(cuts[rank]), len(piece)), piece)
result = w.save(root + "/core", 5)
r = ckpt.Reader(root + "/core")
assert r.world_size == size and len(r.find("w").chunks) == size
out = np.zeros((100,), np.float64)
r.load([ckpt.LoadRequest("w", ckpt.float64, (100,), None, out)])
assert (out == full).all()

try:
    import torch
    import ckpt.torch as ct
except ImportError:
    if os.environ.get("CI") == "true":
        raise
    torch = None
if torch is not None:
    t = torch.from_numpy(piece)
    state = {"w": ct.Chunk(t, (100,), flat_start=int(cuts[rank])), "step": 5,
             "rank": ct.PerRank(rank)}
    ct.save(state, root + "/torch", 5, process_group=comm)
    back = {"w": ct.Chunk(torch.zeros(10, dtype=torch.float64), (100,), offsets=(10 * rank,)),
            "step": None, "rank": ct.PerRank(None)}
    ct.load(back, root + "/torch", process_group=comm)
    assert torch.equal(back["w"].local, torch.arange(10 * rank, 10 * rank + 10,
                                                     dtype=torch.float64))
    assert back["step"] == 5 and back["rank"].value == rank

del w, comm  # before mpi4py finalises MPI
print(f"rank {rank}: ok")
