"""ckpt.torch: save and load PyTorch state dicts through ckpt.

    import ckpt.torch
    state = {"model": model.state_dict(),
             "optim": ckpt.torch.optimizer_state_dict(model, optimizer),
             "rng": ckpt.torch.PerRank(torch.get_rng_state()),
             "step": step}
    ckpt.torch.save(state, "/ckpt/run1", step)          # every rank calls it
    handle = ckpt.torch.save_async(state, "/ckpt/run1", step)  # or: in the
    ...                                      # background; train on at once
    handle.wait()                            # durable (or raises its error)
    ...
    report = ckpt.torch.load(state, "/ckpt/run1")       # in place, `latest`
    ckpt.torch.set_optimizer_state_dict(model, optimizer, state["optim"])

State dicts: nested dicts (with str keys) are flattened with "." into entry
names. A leaf is
  * a torch.Tensor: the whole tensor. With several ranks, ranks that hold
    the same name hold replicas (data parallelism), written once;
  * a DTensor (FSDP2, tensor parallel, any mesh) or a ShardedTensor:
    this rank's local tensor at its global offsets (ckpt.torch.dtensor);
    a Partial placement is refused;
  * a Chunk: this rank's piece of a larger tensor (an n-d box or a flat
    range of the row-major flattening);
  * a PerRank(value): one value (or tensor) per rank;
  * any other value: a Python value (None, bool, int, float, str, bytes,
    and lists, tuples and dicts of them; ckpt.values documents the
    encoding: no pickle, loading never runs code). It must be equal on
    every rank that holds it.

A value with state_dict() and load_state_dict() (a module, an optimizer,
an LR scheduler, a user object) is saved as its state dict and restored
through load_state_dict after the load, like dcp.save and dcp.load:

    ckpt.torch.save({"model": model, "optim": optimizer, "step": step}, root, step)
    ckpt.torch.load({"model": model, "optim": optimizer, "step": None}, root)

(modules and optimizers through torch.distributed.checkpoint.state_dict:
FQN keys, DTensor values under FSDP2 and tensor parallelism).

Loads are in place: tensors of the state dict are written, Python values
are replaced in their dicts. A load reshards: any world size and any
sharding may load any checkpoint.

With several ranks, pass process_group (a torch.distributed group; None
means the default group when torch.distributed is initialised) or any ckpt
communicator (ckpt.MpiCommunicator, or an object with its methods).
"""
from ._comm import ProcessGroupCommunicator
from .checkpointer import Checkpointer
from ._leaves import PER_RANK_METADATA_KEY, Chunk, PerRank, ckpt_dtype
from ._load import load
from ._optim import optimizer_state_dict, set_optimizer_state_dict
from ._save import SaveHandle, release, save, save_async

__all__ = ["Checkpointer", "Chunk", "PerRank", "ProcessGroupCommunicator", "SaveHandle", "ckpt_dtype", "load",
           "optimizer_state_dict", "release", "save", "save_async",
           "set_optimizer_state_dict", "PER_RANK_METADATA_KEY"]


def __getattr__(name):
    if name == "dcp":  # DCP's storage (ckpt.torch.dcp): imported on first use
        import importlib
        return importlib.import_module(".dcp", __name__)
    if name == "Shard":  # its name before DTensor's Shard placement took it
        import warnings
        warnings.warn("ckpt.torch.Shard is now ckpt.torch.Chunk (DTensor's Shard is a "
                      "placement)", DeprecationWarning, stacklevel=2)
        return Chunk
    raise AttributeError(f"module 'ckpt.torch' has no attribute '{name}'")
