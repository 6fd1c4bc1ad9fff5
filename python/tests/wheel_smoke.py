"""Run by test_wheel.py inside the fresh virtual environment where the
wheel is installed, under `torchrun --standalone --nproc-per-node 2`: each
rank saves its half of a tensor and a replicated one through ckpt.torch,
then both load the checkpoint into new tensors, resharded (rank r now
holds columns instead of rows), and check every value.

    torchrun --standalone --nproc-per-node 2 wheel_smoke.py ROOT
"""
import importlib.metadata
import os
import sys

import torch
import torch.distributed as dist

import ckpt
import ckpt.torch as ct


def main(root: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 2, world
    assert ckpt.__version__ == importlib.metadata.version("ckpt"), (
        ckpt.__version__, importlib.metadata.version("ckpt"))
    # Imported from the fresh environment, not from a build tree.
    assert "site-packages" in ckpt.__file__, ckpt.__file__

    full = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)
    rows = full[4 * rank:4 * rank + 4].clone()
    state = {"w": ct.Chunk(rows, full.shape, offsets=(4 * rank, 0)),
             "bias": torch.linspace(0, 1, 5, dtype=torch.bfloat16), "step": 7}
    ct.save(state, root, 7)

    cols = torch.zeros(8, 3)
    bias = torch.zeros(5, dtype=torch.bfloat16)
    back = {"w": ct.Chunk(cols, full.shape, offsets=(0, 3 * rank)), "bias": bias,
            "step": None}
    ct.load(back, root)
    assert torch.equal(cols, full[:, 3 * rank:3 * rank + 3]), cols
    assert torch.equal(bias, state["bias"]), bias
    assert back["step"] == 7, back["step"]
    dist.barrier()
    if rank == 0:
        print(f"wheel smoke: ckpt {ckpt.__version__} from {os.path.dirname(ckpt.__file__)}: "
              "2-rank save, resharded load: ok", flush=True)
    # os._exit skips the interpreter's teardown, as the other gloo tests do
    # (training.py): torch 2.13's gloo worker thread can still be destroying
    # the barrier's work (tensors with Python references) while the
    # interpreter finalizes; its GIL acquire then ends the thread inside a
    # C++ destructor and std::terminate aborts the rank ("terminate called
    # without an active exception"; seen in CI, 1 run in 20 under load; the
    # core shows c10d::ProcessGroupGloo::runLoop -> ~AsyncBarrierWork ->
    # decref_pyobject -> take_gil -> pthread_exit; pytorch/pytorch#179291).
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
