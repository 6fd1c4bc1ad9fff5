#!/usr/bin/env python3
"""Writes the fixture megatron_torch_dist_real/: a Megatron-Core torch_dist
checkpoint saved by megatron.core.dist_checkpointing.save on 2 gloo ranks.

  make_megatron.py OUT --stub-cuda

Interpreter: one that has megatron-core installed (the fixture: megatron-core
0.16.1 with psutil and torch 2.13.0+cpu, in a scratch virtual environment).
requirements.txt does not pin megatron-core and the project's .venv does not
have it, so no test runs this script; the tests read its committed output.

megatron-core cannot run on a CPU-only torch: its synchronous torch_dist save
calls two torch.cuda functions unconditionally, which raise there:
  - torch.cuda.synchronize()      megatron/core/dist_checkpointing/strategies/
                                  filesystem_async.py:230 (preload_tensors,
                                  whose non_blocking=True is hard-coded)
  - torch.cuda.current_device()   megatron/core/dist_checkpointing/strategies/
                                  state_dict_saver.py:252
                                  (save_state_dict_async_finalize: the device
                                  of the failure flag it broadcasts)
--stub-cuda replaces exactly these two in the writing processes:
torch.cuda.synchronize with a no-op and torch.cuda.current_device with a
function returning "cpu". Megatron's source is not changed, and everything
it writes is its own. Without the flag the save fails on a CPU-only torch.

What is saved (ShardedTensors as Megatron's models build them, a
ShardedObject, and common state):
  model.w_rows    float32 [6, 4]  from_rank_offsets along dim 0 (3 + 3 rows)
  model.w_uneven  float64 [5, 3]  dim 0, 3 + 2 rows (no regular grid)
  model.w_cols    int32 [4, 6]    dim 1, 2 + 4 columns (no regular grid)
  model.norm      bfloat16 [7]    replicated (replica_id = rank)
  opt.step_count  int64 []        replicated
  extra.note      ShardedObject {"epoch": 3, "name": "fixture"}, global
                  shape (1,), replicated; Megatron stores it as the bytes
                  item "extra.note/shard_0_1" holding torch.save([obj])
  common.pt       {"iteration": 1000, "checkpoint_version": 3.0,
                  "num_floating_point_operations_so_far": 0}

OUT/expected.json: the versions; every tensor's values (as float64, flat);
"objects": every bytes item by its DCP name, as Python's repr of what
torch.load reads from its stored range; "common": repr of common.pt loaded;
"megatron_load": "equal" once megatron.core.dist_checkpointing.load read
the checkpoint back on both ranks with every tensor and the object equal
(the script fails otherwise). The .metadata is not byte-reproducible
(StorageMeta.save_id is a fresh uuid4); tests compare values. Run it from
the directory that is to hold OUT with OUT a relative name (as the fixture
was: `make_megatron.py megatron_torch_dist_real --stub-cuda` in
tests/data/interop/), since StorageMeta.checkpoint_id records OUT as given.
"""
import io
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# The tensors and values of the DCP fixtures (make_dcp.py, beside this file).
from make_dcp import TENSORS, global_value

NOTE = {"epoch": 3, "name": "fixture"}
COMMON = {"iteration": 1000, "checkpoint_version": 3.0,
          "num_floating_point_operations_so_far": 0}


def sharded_state_dict(rank, world):
    from megatron.core.dist_checkpointing import ShardedObject, ShardedTensor
    sd = {}
    for name, (shape, dtype, split) in TENSORS.items():
        full = global_value(name, shape, dtype)
        if split is None:  # replicated: rank 0 holds the main replica
            sd[name] = ShardedTensor.from_rank_offsets(name, full.clone(), replica_id=rank)
            continue
        _, dim, sizes = split
        start = sum(sizes[:rank])
        local = full.narrow(dim, start, sizes[rank]).contiguous()
        if len(set(sizes)) == 1:  # even: the regular grid
            sd[name] = ShardedTensor.from_rank_offsets(name, local, (dim, rank, world))
        else:  # uneven: no regular grid (axis_fragmentations None)
            offs = [0] * len(shape)
            offs[dim] = start
            sd[name] = ShardedTensor(name, local, dtype, tuple(local.shape), tuple(shape),
                                     tuple(offs), None, replica_id=0)
    sd["extra.note"] = ShardedObject("extra.note", dict(NOTE), (1,), (0,), replica_id=rank)
    sd.update(COMMON)
    return sd


def check_load(rank, world, out):
    """Megatron's own load of OUT equals what was saved (raises otherwise)."""
    from megatron.core import dist_checkpointing
    want = sharded_state_dict(rank, world)
    got = dist_checkpointing.load(sharded_state_dict(rank, world), out)
    for name in TENSORS:
        if not torch.equal(got[name], want[name].data):
            raise AssertionError(f"rank {rank}: {name} loads as {got[name]}")
    if got["extra.note"] != NOTE:
        raise AssertionError(f"rank {rank}: extra.note loads as {got['extra.note']}")


def run_rank(rank, world, out, port, stub):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if stub:
        torch.cuda.synchronize = lambda *a, **k: None
        torch.cuda.current_device = lambda: "cpu"
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import dist_checkpointing
    dist_checkpointing.save(sharded_state_dict(rank, world), out)
    dist.barrier()
    check_load(rank, world, out)
    dist.barrier()
    dist.destroy_process_group()


def stored_objects(out):
    """Each bytes item's value, as torch.load reads its stored byte range."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata
    md = FileSystemReader(out).read_metadata()
    objects = {}
    for index, info in md.storage_data.items():
        if not isinstance(md.state_dict_metadata[index.fqn], BytesStorageMetadata):
            continue
        with open(os.path.join(out, info.relative_path), "rb") as f:
            f.seek(info.offset)
            record = f.read(info.length)
        objects[index.fqn] = repr(torch.load(io.BytesIO(record), weights_only=True))
    return objects


def expected_json(out):
    import megatron.core
    exp = {"torch": torch.__version__, "megatron_core": megatron.core.__version__,
           "tensors": {}}
    for name, (shape, dtype, split) in TENSORS.items():
        v = global_value(name, shape, dtype)
        exp["tensors"][name] = {"dtype": str(dtype), "shape": shape,
                                "values": v.to(torch.float64).flatten().tolist()}
    exp["objects"] = stored_objects(out)
    exp["common"] = repr(torch.load(os.path.join(out, "common.pt"), weights_only=True))
    exp["megatron_load"] = "equal"  # check_load passed on every rank
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(exp, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(run_rank, args=(2, out, port, "--stub-cuda" in sys.argv), nprocs=2, join=True)
    expected_json(out)
