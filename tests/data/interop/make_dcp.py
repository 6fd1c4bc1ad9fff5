#!/usr/bin/python3
"""Writes PyTorch Distributed Checkpoint (DCP) fixtures for ckpt's tests.

  make_dcp.py real OUT        a DCP checkpoint written by the installed torch
                              (Debian's 1.13: torch.distributed._shard.checkpoint)
                              on 2 gloo ranks: sharded tensors split along dim 0
                              (even and uneven) and dim 1, a replicated tensor,
                              a bfloat16 tensor and a bytes item; plus
                              OUT/expected.json with every value.
  make_dcp.py modern OUT      the layout of current PyTorch releases (2.4 and
                              later), built by hand: classes pickled under
                              torch.distributed.checkpoint.*, Metadata with
                              version, storage_meta and planner_data, _StorageInfo
                              with transform_descriptors, one concatenated
                              __<rank>_0.distcp per rank addressed by offset and
                              length, torch.save records with the byteorder and
                              .data/serialization_id entries; and, with --megatron,
                              Megatron-Core's torch_dist files metadata.json and
                              common.pt.
  make_dcp.py hostile OUT     files that must be refused: pickles calling
                              os.system, a deflated and an overlapping zip entry.

The Python 3.11 workaround for importing torch 1.13's DCP is here only: its
ShardedTensorMetadata has a TensorProperties instance as a dataclass default,
which Python 3.11 rejects unless TensorProperties is hashable.
"""
import dataclasses
import io
import json
import os
import pickle
import sys
import types
import zipfile

_dataclass = dataclasses.dataclass


def _hashable_tensor_properties(cls=None, **kw):
    if cls is None:
        return lambda c: _hashable_tensor_properties(c, **kw)
    return _dataclass(cls, **kw, **({"unsafe_hash": True} if cls.__name__ == "TensorProperties" else {}))


dataclasses.dataclass = _hashable_tensor_properties
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._shard.checkpoint as dcp  # noqa: E402
from torch.distributed._shard.sharded_tensor import Shard, ShardMetadata, init_from_local_shards  # noqa: E402

dataclasses.dataclass = _dataclass

# name: (global shape, dtype, split: ("dim", d, sizes) or None for replicated)
TENSORS = {
    "model.w_rows": ([6, 4], torch.float32, ("dim", 0, [3, 3])),
    "model.w_uneven": ([5, 3], torch.float64, ("dim", 0, [3, 2])),
    "model.w_cols": ([4, 6], torch.int32, ("dim", 1, [2, 4])),
    "model.norm": ([7], torch.bfloat16, None),
    "opt.step_count": ([], torch.int64, None),
}


def global_value(name, shape, dtype):
    n = 1
    for d in shape:
        n *= d
    seed = sum(map(ord, name))
    t = (torch.arange(n, dtype=torch.float64) * 0.5 + seed % 17 - 3).reshape(shape)
    return t.to(dtype)


def state_dict(rank, world):
    sd = {}
    for name, (shape, dtype, split) in TENSORS.items():
        full = global_value(name, shape, dtype)
        if split is None:
            sd[name] = full
            continue
        _, dim, sizes = split
        shards = []
        start = sum(sizes[:rank])
        offsets = [0] * len(shape)
        offsets[dim] = start
        local = full.narrow(dim, start, sizes[rank]).contiguous()
        md = ShardMetadata(shard_offsets=offsets, shard_sizes=list(local.shape), placement=f"rank:{rank}/cpu")
        shards.append(Shard(local, md))
        sd[name] = init_from_local_shards(shards, shape)
    sd["extra.note"] = {"epoch": 3, "name": "fixture"}
    return sd


def run_rank(rank, world, out, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dcp.save_state_dict(state_dict(rank, world), dcp.FileSystemWriter(out))
    dist.barrier()
    dist.destroy_process_group()


def expected_json(out):
    exp = {"torch": torch.__version__, "tensors": {}}
    for name, (shape, dtype, split) in TENSORS.items():
        v = global_value(name, shape, dtype)
        exp["tensors"][name] = {"dtype": str(dtype), "shape": shape,
                                "values": v.to(torch.float64).flatten().tolist()}
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(exp, f, indent=1)


def real(out):
    import socket
    import torch.multiprocessing as mp
    os.makedirs(out, exist_ok=True)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(run_rank, args=(2, out, port), nprocs=2, join=True)
    expected_json(out)


# ---- the layout of current releases, by hand --------------------------------

def fake_class(module, name, fields, getstate=None):
    mod = sys.modules.setdefault(module, types.ModuleType(module))
    cls = type(name, (), {"__module__": module, "__qualname__": name})
    if getstate is not None:
        cls.__getstate__ = getstate
    setattr(mod, name, cls)
    cls._fields = fields
    return cls


def make(cls, **kw):
    obj = cls.__new__(cls)
    obj.__dict__.update(kw)
    return obj


class Enum:
    pass


def modern_classes():
    m = "torch.distributed.checkpoint.metadata"
    for parent in ["torch.distributed", "torch.distributed.checkpoint"]:
        sys.modules.setdefault(parent, types.ModuleType(parent))
    c = types.SimpleNamespace()
    c.Metadata = fake_class(m, "Metadata", None)
    c.TensorStorageMetadata = fake_class(m, "TensorStorageMetadata", None)
    c.ChunkStorageMetadata = fake_class(m, "ChunkStorageMetadata", None)
    c.BytesStorageMetadata = fake_class(m, "BytesStorageMetadata", None)
    c.MetadataIndex = fake_class(m, "MetadataIndex", None)
    c.StorageMeta = fake_class(m, "StorageMeta", None)
    # Current TensorProperties pickles a tuple whose memory format is
    # getattr(_MEM_FORMAT_ENCODING, "TORCH_CONTIGUOUS_FORMAT").
    enum_cls = fake_class(m, "_MEM_FORMAT_ENCODING", None)

    class MemFormat:
        def __reduce__(self):
            return (getattr, (enum_cls, "TORCH_CONTIGUOUS_FORMAT"))

    def props_state(self):
        return (self.dtype, torch.strided, False, MemFormat(), False)
    c.TensorProperties = fake_class(m, "TensorProperties", None, props_state)
    c._StorageInfo = fake_class("torch.distributed.checkpoint.filesystem", "_StorageInfo", None)
    return c


def stored(name, compress=zipfile.ZIP_STORED):
    """A ZipInfo with a fixed date, so that the fixtures are reproducible."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = compress
    return info


def torch_save_record(obj, compress=zipfile.ZIP_STORED):
    """torch.save of obj, plus the entries that current releases add."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as z:
        for info in src.infolist():
            z.writestr(stored(info.filename, compress), src.read(info.filename))
            if info.filename.endswith("/data.pkl"):
                prefix = info.filename[: -len("/data.pkl")]
                z.writestr(stored(prefix + "/byteorder"), "little")
        z.writestr(stored(prefix + "/.data/serialization_id"),
                   "1234567890123456789012345678901234567890")
    return out.getvalue()


def modern(out, megatron, compress=zipfile.ZIP_STORED, path_of_rank1=None):
    c = modern_classes()
    os.makedirs(out, exist_ok=True)
    world = 2
    files = {r: bytearray() for r in range(world)}
    sdm, storage = {}, {}
    for name, (shape, dtype, split) in TENSORS.items():
        full = global_value(name, shape, dtype)
        chunks = []
        pieces = [(0, full, [0] * len(shape))] if split is None else []
        if split is not None:
            _, dim, sizes = split
            for r in range(world):
                start = sum(sizes[:r])
                offs = [0] * len(shape)
                offs[dim] = start
                pieces.append((r, full.narrow(dim, start, sizes[r]).contiguous(), offs))
        for rank, piece, offs in pieces:
            rec = torch_save_record(piece, compress)
            f = files[rank]
            path = path_of_rank1 if rank == 1 and path_of_rank1 else f"__{rank}_0.distcp"
            info = make(c._StorageInfo, relative_path=path, offset=len(f),
                        length=len(rec), transform_descriptors=[])
            f += rec
            storage[make(c.MetadataIndex, fqn=name, offset=torch.Size(offs), index=len(chunks))] = info
            chunks.append(make(c.ChunkStorageMetadata, offsets=torch.Size(offs), sizes=piece.shape))
        props = make(c.TensorProperties, dtype=dtype)
        sdm[name] = make(c.TensorStorageMetadata, properties=props, size=torch.Size(shape), chunks=chunks)
    rec = torch_save_record({"epoch": 3, "name": "fixture"})
    storage[make(c.MetadataIndex, fqn="extra.note", offset=None, index=None)] = make(
        c._StorageInfo, relative_path="__0_0.distcp", offset=len(files[0]), length=len(rec),
        transform_descriptors=None)
    files[0] += rec
    sdm["extra.note"] = make(c.BytesStorageMetadata)
    meta = make(c.Metadata, state_dict_metadata=sdm,
                planner_data={k: tuple(k.split(".")) for k in sdm},
                storage_data=storage,
                storage_meta=make(c.StorageMeta, checkpoint_id=out.rstrip("/").split("/")[-1],
                                  save_id="save-1", load_id=None, modules=[]),
                version="1.0.0")
    for r, data in files.items():
        with open(os.path.join(out, f"__{r}_0.distcp"), "wb") as f:
            f.write(data)
    with open(os.path.join(out, ".metadata"), "wb") as f:
        pickle.dump(meta, f, protocol=4)
    if megatron:
        with open(os.path.join(out, "metadata.json"), "w") as f:
            json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                       "common_backend": "torch", "common_backend_version": 1}, f)
        torch.save({"iteration": 1000, "checkpoint_version": 3.0,
                    "num_floating_point_operations_so_far": 0}, os.path.join(out, "common.pt"))
    expected_json(out)


# ---- hostile inputs ---------------------------------------------------------

def hostile(out):
    """Files that must be refused with a clear error, never run or crash."""
    os.makedirs(out, exist_ok=True)

    class System:
        def __reduce__(self):
            return (os.system, ("echo pwned > /tmp/ckpt-pwned",))
    with open(os.path.join(out, "os_system.pkl"), "wb") as f:
        pickle.dump({"x": System()}, f, protocol=2)
    # A DCP directory whose .metadata calls os.system.
    d = os.path.join(out, "dcp_os_system")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, ".metadata"), "wb") as f:
        pickle.dump(System(), f, protocol=4)
    # A torch.save record whose data.pkl is deflated.
    rec = torch_save_record(torch.arange(4, dtype=torch.float32))
    src = zipfile.ZipFile(io.BytesIO(rec))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for info in src.infolist():
            z.writestr(stored(info.filename, zipfile.ZIP_DEFLATED), src.read(info.filename))
    with open(os.path.join(out, "compressed.zip"), "wb") as f:
        f.write(buf.getvalue())
    # The same record with the second entry's local header offset pointing
    # into the first entry (overlapping entries).
    data = bytearray(rec)
    z = zipfile.ZipFile(io.BytesIO(rec))
    infos = z.infolist()
    # Find the central header of entry 1 and rewrite its local offset.
    pos = 0
    for i in range(2):
        pos = data.index(b"PK\x01\x02", pos if i == 0 else pos + 4)
    struct_off = pos + 42
    data[struct_off:struct_off + 4] = (infos[0].header_offset).to_bytes(4, "little")
    with open(os.path.join(out, "overlap.zip"), "wb") as f:
        f.write(bytes(data))
    with open(os.path.join(out, "record.zip"), "wb") as f:
        f.write(rec)
    # DCP directories: deflated records; rank 1's items "in" ../__1_0.distcp.
    modern(os.path.join(out, "dcp_compressed"), False, compress=zipfile.ZIP_DEFLATED)
    modern(os.path.join(out, "dcp_outside"), False, path_of_rank1="../__1_0.distcp")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("real", "modern", "hostile"):
        sys.exit(__doc__)
    if sys.argv[1] == "real":
        real(sys.argv[2])
    elif sys.argv[1] == "hostile":
        hostile(sys.argv[2])
    else:
        modern(sys.argv[2], "--megatron" in sys.argv)
