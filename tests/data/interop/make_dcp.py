#!/usr/bin/env python3
"""Writes PyTorch Distributed Checkpoint (DCP) fixtures for ckpt's tests.

  make_dcp.py real OUT [--prefix P]
                              DCP checkpoints written by the installed torch
                              (2.4 or later; the fixtures by 2.13.0):
                              torch.distributed.checkpoint.save of DTensors on
                              a 1-D "cpu" device mesh of 2 gloo ranks (Shard(0)
                              even and uneven, Shard(1), Shard(0) of 1 row so
                              that rank 1 holds an empty chunk, a Replicate()d
                              bfloat16 tensor), a plain scalar tensor and a
                              nested dict of plain data (which DCP flattens
                              into bytes items). One save per FileSystemWriter
                              layout, each in OUT/P<suffix>:
                                P                the defaults: one
                                                 __<rank>_0.distcp per rank,
                                                 a global .metadata
                                P_item_files     single_file_per_rank=False:
                                                 one file per item
                                P_rank_local     save(use_collectives=False):
                                                 no .metadata, one
                                                 __<rank>.metadata per rank
                                P_safetensors    serialization_format=
                                                 SAFETENSORS (torch's own
                                                 FileSystemReader cannot load
                                                 it; ckpt refuses it)
                              P defaults to dcp_torch<major><minor> (dcp_torch213).
                              Each holds expected.json: every tensor's values
                              and every bytes item's Python repr, as torch
                              computes them, and whether torch's dcp.load
                              read the checkpoint back equal ("torch_load").
  make_dcp.py real113 OUT     a DCP checkpoint written by torch 1.13 (Debian
                              12's python3-torch; it is no longer installed):
                              torch.distributed._shard.checkpoint with
                              ShardedTensors; the fixture dcp_torch113/.
  make_dcp.py modern OUT      a DCP layout built by hand (classes pickled under
                              torch.distributed.checkpoint.*, records made with
                              the installed torch.save); with --megatron,
                              Megatron-Core's torch_dist files metadata.json
                              and common.pt (the fixture megatron_torch_dist/).
                              Also the base of hostile/dcp_*.
  make_dcp.py hostile OUT     files that must be refused: pickles calling
                              os.system, a deflated and an overlapping zip entry.

The records that torch 2.x writes are byte-reproducible (zip dates are zero,
.data/serialization_id is derived from the content); .metadata is not: its
StorageMeta.save_id is a fresh uuid4 per save. Tests compare values, never
bytes.
"""
import io
import json
import os
import pickle
import sys
import types
import zipfile


def import_torch113_dcp():
    """torch 1.13's DCP, imported on Python 3.11: its ShardedTensorMetadata has
    a TensorProperties instance as a dataclass default, which Python 3.11
    rejects unless TensorProperties is hashable. Called before anything else
    imports torch (as the workaround always was), in every process of
    real113."""
    import dataclasses
    dataclass = dataclasses.dataclass

    def hashable_tensor_properties(cls=None, **kw):
        if cls is None:
            return lambda c: hashable_tensor_properties(c, **kw)
        extra = {"unsafe_hash": True} if cls.__name__ == "TensorProperties" else {}
        return dataclass(cls, **kw, **extra)

    dataclasses.dataclass = hashable_tensor_properties
    try:
        import torch.distributed._shard.checkpoint as dcp
        from torch.distributed._shard.sharded_tensor import Shard, ShardMetadata, init_from_local_shards
    finally:
        dataclasses.dataclass = dataclass
    return dcp, Shard, ShardMetadata, init_from_local_shards


# sys.argv is the parent's in the processes that mp.spawn starts too.
TORCH113 = import_torch113_dcp() if sys.argv[1:2] == ["real113"] else None

import torch  # noqa: E402

# name: (global shape, dtype, split: ("dim", d, sizes) or None for replicated)
# (the torch 1.13 fixture's tensors; real113 shards them by hand).
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


def expected_json(out, tensors=None, objects=None, **extra):
    """OUT/expected.json: every tensor's values as float64, in row-major order."""
    tensors = tensors if tensors is not None else {
        name: global_value(name, shape, dtype) for name, (shape, dtype, _) in TENSORS.items()}
    exp = {"torch": torch.__version__, **extra, "tensors": {}}
    for name, v in tensors.items():
        exp["tensors"][name] = {"dtype": str(v.dtype), "shape": list(v.shape),
                                "values": v.to(torch.float64).flatten().tolist()}
    if objects is not None:
        exp["objects"] = objects
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(exp, f, indent=1)


def spawn_ranks(fn, world, *args):
    """fn(rank, world, *args, store) on `world` processes that meet through a
    FileStore in a fresh temporary directory: no TCP port, which another
    process (a test beside this one) could take between a free-port probe
    and the bind."""
    import shutil
    import tempfile
    import torch.multiprocessing as mp
    tmp = tempfile.mkdtemp(prefix="make_dcp-")
    try:
        mp.spawn(fn, args=(world, *args, os.path.join(tmp, "store")), nprocs=world, join=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def init_gloo(rank, world, store):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)


# ---- torch 2.x: torch.distributed.checkpoint.save of DTensors ---------------

# name: (global shape, dtype, placement: "shard0", "shard1", "replicate", or
# None for a plain tensor, the same on every rank).
TENSORS_2 = {
    "model.w_rows": ([6, 4], torch.float32, "shard0"),
    "model.w_uneven": ([5, 3], torch.float64, "shard0"),  # 3 + 2 rows
    "model.w_cols": ([4, 6], torch.int32, "shard1"),
    "model.tiny": ([1, 3], torch.float32, "shard0"),  # rank 1: 0 rows
    "model.norm": ([7], torch.bfloat16, "replicate"),
    "opt.step_count": ([], torch.int64, None),
}
# Plain data: DCP flattens the dicts, so these are the bytes items
# "extra.note.epoch" and "extra.note.name" (planner_data keeps the path).
EXTRA = {"note": {"epoch": 3, "name": "fixture"}}
OBJECTS_2 = {"extra.note.epoch": repr(3), "extra.note.name": repr("fixture")}

# suffix: (FileSystemWriter keyword arguments, dcp.save keyword arguments)
VARIANTS_2 = {
    "": ({}, {}),
    "_item_files": ({"single_file_per_rank": False}, {}),
    "_rank_local": ({}, {"use_collectives": False}),
    "_safetensors": ({"serialization_format": "SAFETENSORS"}, {}),
}


def dtensor_state_dict(mesh):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    placements = {"shard0": [Shard(0)], "shard1": [Shard(1)], "replicate": [Replicate()]}
    sd = {}
    for name, (shape, dtype, placement) in TENSORS_2.items():
        full = global_value(name, shape, dtype)
        sd[name] = full if placement is None else distribute_tensor(full, mesh, placements[placement])
    sd["extra"] = json.loads(json.dumps(EXTRA))
    return sd


def torch_load_result(mesh, path):
    """Whether torch's own dcp.load reads `path` back into fresh DTensors equal
    to the saved values: "equal", or the error it raised."""
    import logging
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    # dcp.load logs its fallback to rank-local metadata on the root logger, as a
    # warning with a trace.
    logging.getLogger().setLevel(logging.ERROR)
    sd = dtensor_state_dict(mesh)
    for v in sd.values():
        if isinstance(v, torch.Tensor):
            v.zero_()
    sd["extra"] = {"note": {"epoch": 0, "name": ""}}
    try:
        dcp.load(sd, storage_reader=dcp.FileSystemReader(path))
    except (Exception, CheckpointException) as e:  # noqa: BLE001 (recorded)
        return f"fails: {type(e).__name__}"
    for name, (shape, dtype, placement) in TENSORS_2.items():
        got = sd[name] if placement is None else sd[name].full_tensor()
        if not torch.equal(got, global_value(name, shape, dtype)):
            return f"differs: {name}"
    return "equal" if sd["extra"] == EXTRA else "differs: extra"


def run_rank_2(rank, world, out, prefix, store):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import SerializationFormat
    from torch.distributed.device_mesh import init_device_mesh
    init_gloo(rank, world, store)
    mesh = init_device_mesh("cpu", (world,))
    # Relative paths, so that StorageMeta.checkpoint_id is the directory name.
    os.chdir(out)
    loads = {}
    for suffix, (writer_kw, save_kw) in VARIANTS_2.items():
        writer_kw = dict(writer_kw)
        if "serialization_format" in writer_kw:
            writer_kw["serialization_format"] = SerializationFormat[writer_kw["serialization_format"]]
        path = prefix + suffix
        dcp.save(dtensor_state_dict(mesh), storage_writer=dcp.FileSystemWriter(path, **writer_kw),
                 **save_kw)
        dist.barrier()
        results = [None] * world
        dist.all_gather_object(results, torch_load_result(mesh, path))
        loads[suffix] = "equal" if set(results) == {"equal"} else ", ".join(
            f"rank {r}: {x}" for r, x in enumerate(results))
    if rank == 0:
        for suffix, (writer_kw, save_kw) in VARIANTS_2.items():
            tensors = {name: global_value(name, shape, dtype)
                       for name, (shape, dtype, _) in TENSORS_2.items()}
            expected_json(prefix + suffix, tensors, OBJECTS_2, world_size=world,
                          writer={**writer_kw, **save_kw}, torch_load=loads[suffix])
    dist.barrier()
    dist.destroy_process_group()


def real(out, prefix):
    os.makedirs(out, exist_ok=True)
    if prefix is None:
        major, minor = torch.__version__.split(".")[:2]
        prefix = f"dcp_torch{major}{minor}"
    spawn_ranks(run_rank_2, 2, os.path.abspath(out), prefix)


# ---- torch 1.13: torch.distributed._shard.checkpoint of ShardedTensors ------

def state_dict_113(rank, world):
    _, Shard, ShardMetadata, init_from_local_shards = TORCH113
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


def run_rank_113(rank, world, out, store):
    import torch.distributed as dist
    dcp = TORCH113[0]
    init_gloo(rank, world, store)
    dcp.save_state_dict(state_dict_113(rank, world), dcp.FileSystemWriter(out))
    dist.barrier()
    dist.destroy_process_group()


def real113(out):
    os.makedirs(out, exist_ok=True)
    spawn_ranks(run_rank_113, 2, out)
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
    """torch.save of obj, rewritten with fixed dates, plus the byteorder and
    .data/serialization_id entries of current releases where the installed
    torch.save did not write them (1.13)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    names = src.namelist()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as z:
        for info in src.infolist():
            z.writestr(stored(info.filename, compress), src.read(info.filename))
            if info.filename.endswith("/data.pkl"):
                prefix = info.filename[: -len("/data.pkl")]
                if prefix + "/byteorder" not in names:
                    z.writestr(stored(prefix + "/byteorder"), "little")
        if prefix + "/.data/serialization_id" not in names:
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
    if len(sys.argv) < 3 or sys.argv[1] not in ("real", "real113", "modern", "hostile"):
        sys.exit(__doc__)
    if sys.argv[1] == "real":
        args = sys.argv[3:]
        real(sys.argv[2], args[args.index("--prefix") + 1] if "--prefix" in args else None)
    elif sys.argv[1] == "real113":
        real113(sys.argv[2])
    elif sys.argv[1] == "hostile":
        hostile(sys.argv[2])
    else:
        modern(sys.argv[2], "--megatron" in sys.argv)
