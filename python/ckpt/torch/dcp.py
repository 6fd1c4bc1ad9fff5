"""ckpt as a storage of torch.distributed.checkpoint (DCP).

    import torch.distributed.checkpoint as dcp
    import ckpt.torch.dcp

    dcp.save(state, storage_writer=ckpt.torch.dcp.Writer("/ckpt/run1", step=100))
    future = dcp.async_save(state, storage_writer=ckpt.torch.dcp.Writer(
        "/ckpt/run1", step=200, process_group=ckpt_pg), process_group=ckpt_pg)
    ...                                   # train on: ckpt took the snapshot
    future.result()                       # committed
    dcp.load(state, storage_reader=ckpt.torch.dcp.Reader("/ckpt/run1"))  # latest

What DCP writes through Writer is an ordinary ckpt checkpoint (spec/FORMAT.md):
step-NNNNNNNN under the root, committed atomically by its manifest, every
block checksummed; ckpt-validate, ckpt-inspect, ckpt-diff, ckpt-reshard,
ckpt-convert and ckpt.Reader read it like any other, and Reader serves DCP
from any ckpt checkpoint, resharding to whatever the loading ranks hold.

The mapping
-----------
* A DCP FQN (the planner's flattened key, "model.layers.0.weight") is the
  ckpt entry name, unchanged. A name that breaks ckpt's name rules (a "/",
  "..", a control byte; spec §8.1) is refused naming it.
* A tensor write item (WriteItemType.TENSOR or SHARD) is one chunk of the
  entry: its TensorWriteData.size is the entry's global shape, its
  properties.dtype the entry's dtype, and its chunk (offsets, sizes) the
  chunk's box. Every chunk is registered as a replica, so a piece that
  several ranks hold is written once (DCP's planner has deduplicated them
  already; ckpt would too). A rank holds at most one chunk of an entry.
  An empty chunk (a Shard of fewer rows than ranks) covers nothing and is
  not stored.
* A bytes write item (WriteItemType.BYTE_IO) is an object entry holding
  exactly the bytes the planner gives (DefaultSavePlanner: torch.save of
  the value); ckpt never interprets them.
* DCP's Metadata is not stored: Reader.read_metadata rebuilds it from the
  manifest. An object entry is BytesStorageMetadata; a tensor entry is
  TensorStorageMetadata with the entry's shape, a dtype from its ckpt dtype,
  and one ChunkStorageMetadata per stored box (an entry stored in flat
  ranges, which DCP cannot express, shows one chunk covering the tensor:
  ckpt reshards it on load). What the manifest cannot say is stored as JSON
  in the checkpoint's user metadata under "ckpt.torch.dcp" (never pickle):
  the planner's planner_data (FQN -> key path, DefaultSavePlanner's
  flattening map; a planner_data that is not such a map is refused), and
  each tensor's TensorProperties that differ from the defaults
  (requires_grad, memory_format, pin_memory, layout). Values over 1 MiB
  continue in "ckpt.torch.dcp.partN". A checkpoint without that key (saved
  by ckpt.torch.save, ckpt-convert, ckpt-reshard) loads too: objects that
  are ckpt.values are handed to the planner as torch.save bytes of the value.

Saving: DCP's calls, and which collectives run where
----------------------------------------------------
DCP calls set_up_storage_writer, prepare_local_plan (every rank),
prepare_global_plan (the coordinator), write_data (every rank) and finish
(the coordinator only). A ckpt save is collective, so it runs in write_data:
  * prepare_local_plan checks what needs no collective (dtypes ckpt has, one
    chunk per entry per rank), puts the rank's part of the JSON metadata in
    the plan's storage_data and, under a planner whose global plan is
    DefaultSavePlanner's (no plan caching), keeps the plan's items and
    hands DCP the plan without them: DCP's pickled gather of every rank's
    plan and scatter of the global plan cost 100-200 ms per save with
    1,200 items per rank, and all the global plan does with the items is
    deduplicate replicas, which ckpt does itself. A planner with a global
    plan of its own must be passed to Writer(planner=...) too (then DCP
    plans with the items); write_data refuses it otherwise;
  * prepare_global_plan (coordinator) refuses a step that is committed
    already (unless overwrite) and merges the JSON metadata of all plans;
    DCP scatters it to every rank inside the plans (storage_data), so every
    rank saves the same metadata without a collective of its own;
  * write_data registers this rank's items with a ckpt.Writer over a ckpt
    communicator of the Writer's process group (ProcessGroupCommunicator),
    agrees with the other ranks (one all-gather: a rank that failed to
    register makes every rank raise its error, none waits in the save; the
    lowest rank holding a bytes item saves it; every tensor is registered
    as a replica, so a piece several ranks hold is written once), then
    saves collectively: the checkpoint is committed when write_data returns;
  * finish (coordinator) completes the Metadata that dcp.save returns,
    where DCP planned without the items, from the committed manifest (as
    Reader.read_metadata builds it); DCP's Metadata is never stored.
DCP raises on every rank when any rank fails before write_data (its
reduce_scatter), so every rank reaches write_data's collectives or none does.
The Writer's process group must be DCP's (pass the same process_group to
both; None: the default group). use_collectives=False (rank-local
metadata, no coordination) is refused: a ckpt commit is collective.

dcp.async_save: ckpt does the staging
-------------------------------------
Writer is an AsyncStager, so async_save calls Writer.stage(state_dict) on
the trainer's thread before it starts DCP's save on its background thread.
stage() plans the save with a SavePlanner (Writer(planner=...), default
DefaultSavePlanner(); with that one, the local plan of the group's last
stage() is reused while the state dict keeps its structure: FQNs, shapes,
dtypes, tensor properties, DTensor meshes and placements), registers the
items (an item whose tensor has the memory, dtype, shape, strides and box
it had at the group's last save stays registered: ckpt.torch._registry;
the group's ckpt Writer keeps the tensors so registered until the next
save or ckpt.torch.release(), as ckpt.torch.save's does) and calls ckpt's
Writer.save_async, which returns once every tensor is snapshotted into
ckpt's staging memory (kept by the ckpt Writer of the group and reused by
the next save; CUDA tensors go through ckpt's pinned staging when the
package has CUDA support, else torch copies them to the host first). The
trainer may then change its tensors: the checkpoint holds the values at
the call. ckpt writes in the background; DCP's save, on its own thread,
plans again (metadata only) and its write_data waits for ckpt's save
(whose commit collectives run there), then checks that DCP's plan asks for
nothing the staged one lacks (a different planner: raises, after the
commit, saying so). stage() returns the state dict's containers copied (the tensors not:
nothing reads their values any more). Every rank calls stage() (it runs one
all-gather and ckpt's planning on the group's communicator: the all-gather
carries each rank's part of the JSON metadata only when it changed, else
the token of the group's last document), so DCP's save
must be finished (future.result()) before the next async_save on the same
group. DCP's background thread uses the group too: give async_save and the
Writer a group of their own (dist.new_group(backend="gloo")), as DCP
recommends. If DCP fails after stage() and before write_data (in its own
planning), the staged save completes at the next save of that group, which
waits for it. async_save(async_checkpointer_type=PROCESS) needs a picklable
writer and is refused.

Steps and overwriting
---------------------
checkpoint_id is the checkpoint root; Writer(step=...) the step (default
0; the attribute `step` may be set between saves). A committed step is
never replaced unless Writer(overwrite=True) (FileSystemWriter overwrites by
default; ckpt refuses with AlreadyExistsError naming the directory); other
steps are untouched, and `latest` names the newest commit. Reader(path)
loads `latest` under a root, a step directory, or Reader(root, step=N).
Strictness of a load (missing keys) is the load planner's
(DefaultLoadPlanner(allow_partial_load=...)); entries nobody asks for are
simply not read.

Loading
-------
read_metadata opens the checkpoint on each rank (ckpt.Reader) and rebuilds
the Metadata; read_data turns each ReadItem into a ckpt LoadRequest of the
box it names (the stored chunk's offsets plus storage_offsets, lengths)
into planner.resolve_tensor's tensor, then planner.commit_tensor; bytes
items go to planner.load_bytes. ckpt reads only the blocks each box needs
and verifies each. A destination that is not a contiguous CPU tensor of
the stored dtype is loaded through a temporary and copied in (converting
the dtype, as DCP's FileSystemReader does). Under a load planner whose
global plan is DefaultLoadPlanner's (the local plans unchanged),
prepare_local_plan keeps the read items and hands DCP's gather and scatter
the plan without them; a planner with a global plan of its own must be
passed to Reader(planner=...) too (read_data refuses it otherwise).
"""
import dataclasses
import hashlib
import io
import json
import os
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,
                                                   Metadata, StorageMeta, TensorProperties,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner, SavePlan,
                                                  SavePlanner, WriteItem, WriteItemType)
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from .. import _ckpt
from .. import values as _values
from .._errors import (AlreadyExistsError, DataLossError, FailedPreconditionError,
                       InvalidArgumentError, NotFoundError, UnimplementedError)
from ._comm import _communicator, _error_info, _exchange, _raise_if_any_rank_failed
from ._leaves import _stored_as_elements, ckpt_dtype
from ._registry import VALUE, tensor_signature
from ._save import _new_writer

__all__ = ["Writer", "Reader", "METADATA_KEY"]

# The user-metadata key of the JSON that DCP needs beyond the manifest.
METADATA_KEY = "ckpt.torch.dcp"
_FORMAT_VERSION = 1
_PART_CHARS = 250_000  # <= 1 MiB of UTF-8 per metadata value (spec §10)

# --- dtypes and buffers -------------------------------------------------------

# Dtypes the extension borrows as they are (DLPack int, uint, float, bfloat);
# others (bool, float8) are borrowed as unsigned integers of their width.
_NATIVE = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
           torch.bfloat16, torch.float32, torch.float64}
_UNSIGNED = {1: torch.uint8}
for _bits, _name in ((2, "uint16"), (4, "uint32"), (8, "uint64")):
    if hasattr(torch, _name):  # torch >= 2.3
        _NATIVE.add(getattr(torch, _name))
        _UNSIGNED[_bits] = getattr(torch, _name)


def _torch_dtypes() -> Dict[Any, torch.dtype]:
    out = {}
    candidates = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                  torch.float16, torch.bfloat16, torch.float32, torch.float64]
    candidates += [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2")
                   if hasattr(torch, n)]
    for t in candidates:
        try:
            out[ckpt_dtype(t)] = t
        except TypeError:
            pass
    for name in ("uint16", "uint32", "uint64"):  # ckpt has them; ckpt.torch does not save them
        if hasattr(torch, name):
            out.setdefault(getattr(_ckpt.DType, name), getattr(torch, name))
    return out


_TORCH_DTYPES = _torch_dtypes()


def _ckpt_dtype(fqn: str, dtype: torch.dtype):
    """The ckpt dtype of a torch dtype; TypeError naming the entry."""
    for c, t in _TORCH_DTYPES.items():
        if t == dtype:
            return c
    raise TypeError(f"entry '{fqn}': torch dtype {dtype} has no ckpt element type")


def _torch_dtype(fqn: str, dtype) -> torch.dtype:
    try:
        return _TORCH_DTYPES[dtype]
    except KeyError:
        raise UnimplementedError(f"entry '{fqn}': ckpt dtype {dtype} has no torch dtype") from None


def _borrowable(t: torch.Tensor) -> torch.Tensor:
    """`t` (contiguous) as the extension borrows it: itself, or a view as an
    unsigned integer of its width (bool, float8)."""
    return t if t.dtype in _NATIVE else t.view(_UNSIGNED[t.element_size()])


def _host_tensor(fqn: str, t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor ckpt can read: CPU, or CUDA when the package has
    CUDA support (the caller synchronizes torch's current stream), its memory
    holding its values (negative-bit and conjugate views resolved).
    Copies only what is not so already. InvalidArgumentError naming the
    entry for a tensor whose memory does not hold its elements
    (ckpt.torch._leaves._stored_as_elements)."""
    if t.requires_grad or type(t) is not torch.Tensor:
        t = t.detach()
    t = t.resolve_conj().resolve_neg()
    _stored_as_elements(fqn, t)
    if t.device.type != "cpu" and not (t.device.type == "cuda" and _ckpt.has_cuda):
        t = t.cpu()
    return _borrowable(t.contiguous())


# --- the JSON metadata --------------------------------------------------------

_DEFAULT_PROPERTIES = TensorProperties()


def _properties_json(p: TensorProperties) -> Dict[str, Any]:
    """The fields of `p` that differ from TensorProperties' defaults (dtype is
    the entry's)."""
    out = {}
    if p.requires_grad:
        out["requires_grad"] = True
    if p.pin_memory:
        out["pin_memory"] = True
    if p.memory_format != torch.contiguous_format:
        out["memory_format"] = str(p.memory_format).rpartition(".")[2]
    if p.layout != torch.strided:
        out["layout"] = str(p.layout).rpartition(".")[2]
    return out


def _torch_attr(name: str, kind: type, what: str):
    value = getattr(torch, name, None)
    if not isinstance(value, kind):
        raise _corrupt(f"{what} '{name}' is not a torch {kind.__name__}")
    return value


def _properties(dtype: torch.dtype, saved: Dict[str, Any]) -> TensorProperties:
    return TensorProperties(
        dtype=dtype,
        layout=_torch_attr(saved.get("layout", "strided"), torch.layout, "layout"),
        requires_grad=bool(saved.get("requires_grad", False)),
        memory_format=_torch_attr(saved.get("memory_format", "contiguous_format"),
                                  torch.memory_format, "memory_format"),
        pin_memory=bool(saved.get("pin_memory", False)))


def _planner_data_json(planner_data) -> Dict[str, List]:
    """DefaultSavePlanner's flattening map (FQN -> tuple of str and int keys)
    as JSON; UnimplementedError for anything else (ckpt stores no pickle)."""
    if planner_data is None:
        return {}
    ok = isinstance(planner_data, dict) and all(
        isinstance(k, str) and isinstance(v, (tuple, list))
        and all(isinstance(x, (str, int)) and not isinstance(x, bool) for x in v)
        for k, v in planner_data.items())
    if not ok:
        raise UnimplementedError(
            f"the save planner's planner_data is a {type(planner_data).__name__} that is not a "
            "map of FQN to key path (DefaultSavePlanner's): ckpt stores it as JSON, never pickle")
    return {k: list(v) for k, v in planner_data.items()}


def _plan_metadata(plan: SavePlan) -> Dict[str, Any]:
    """What one rank's plan contributes to the JSON metadata."""
    props = {}
    for item in plan.items:
        if item.tensor_data is not None:
            p = _properties_json(item.tensor_data.properties)
            if p:
                props[item.index.fqn] = p
    return {"properties": props, "planner_data": _planner_data_json(plan.planner_data)}


def _merge_metadata(parts: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """One metadata document from every rank's part (the lowest rank's value
    of a key wins, as DCP's ChainMap merge of planner_data does)."""
    merged = {"version": _FORMAT_VERSION, "properties": {}, "planner_data": {}}
    for part in reversed(parts):
        merged["properties"].update(part["properties"])
        merged["planner_data"].update(part["planner_data"])
    return merged


def _encode_metadata(doc: Dict[str, Any]) -> Dict[str, str]:
    """The user-metadata pairs of `doc` (values cut to fit spec §10)."""
    body = json.dumps(doc, separators=(",", ":"), sort_keys=True)
    parts = [body[i:i + _PART_CHARS] for i in range(0, len(body), _PART_CHARS)] or [""]
    pairs = {METADATA_KEY: parts[0]}
    for n, part in enumerate(parts[1:], 1):
        pairs[f"{METADATA_KEY}.part{n}"] = part
    return pairs


def _corrupt(message: str) -> DataLossError:
    return DataLossError(f"metadata '{METADATA_KEY}': {message}")


def _decode_metadata(pairs) -> Optional[Dict[str, Any]]:
    """The metadata document of a checkpoint, or None when DCP did not write
    it. DataLossError for a malformed one."""
    meta = dict(pairs)
    if METADATA_KEY not in meta:
        return None
    body, n = [meta[METADATA_KEY]], 1
    while f"{METADATA_KEY}.part{n}" in meta:
        body.append(meta[f"{METADATA_KEY}.part{n}"])
        n += 1
    try:
        doc = json.loads("".join(body))
    except json.JSONDecodeError as e:
        raise _corrupt(f"not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("version") != _FORMAT_VERSION:
        raise _corrupt(f"version {doc.get('version') if isinstance(doc, dict) else None!r}, "
                       f"this reader knows {_FORMAT_VERSION}")
    return doc


# --- Writer -------------------------------------------------------------------

def _key(item: WriteItem):
    return (item.index.fqn, None if item.index.offset is None else tuple(item.index.offset))


def _box(item: WriteItem):
    chunk = item.tensor_data.chunk
    return _ckpt.Box(tuple(int(o) for o in chunk.offsets), tuple(int(s) for s in chunk.sizes))


def _check_items(items: Sequence[WriteItem]) -> None:
    """What prepare_local_plan refuses: a dtype ckpt lacks, two chunks of one
    entry on one rank (ckpt registers one piece per name and rank)."""
    seen = set()
    for item in items:
        fqn = item.index.fqn
        if item.type == WriteItemType.BYTE_IO:
            continue
        _ckpt_dtype(fqn, item.tensor_data.properties.dtype)
        if fqn in seen:
            raise UnimplementedError(
                f"entry '{fqn}': this rank holds several chunks of it (a ShardedTensor "
                "with several local shards?); ckpt saves one chunk per entry and rank")
        seen.add(fqn)


# The methods that make DefaultSavePlanner's and DefaultLoadPlanner's global
# plans (_local_items).
_GLOBAL_PLANNING = {DefaultSavePlanner: ("create_global_plan", "_create_global_plan",
                                         "_dedup_save_plans", "finish_plan"),
                    DefaultLoadPlanner: ("create_global_plan", "finish_plan")}


def _plans_globally_by_default(planner, default) -> bool:
    """Whether `planner` (None: `default`'s own) makes the global plan as
    `default` does (DefaultSavePlanner: deduplicating replicated items;
    DefaultLoadPlanner: nothing), without plan caching: then ckpt needs no
    global plan of the items (_local_items)."""
    if planner is None:
        return True
    cls = type(planner)
    return isinstance(planner, default) and not getattr(
        planner, "_enable_plan_caching", False) and all(
            getattr(cls, m) is getattr(default, m) for m in _GLOBAL_PLANNING[default])


def _local_items(plan, keep_items: bool):
    """What prepare_local_plan hands DCP: `plan` itself when keep_items,
    else `plan` without its items (and flattening map). DCP pickles every
    rank's local plan to the coordinator and the global plan back: for
    1,200 items per rank, 100-200 ms per save or load on 2-4 ranks. Under
    the default planners ckpt needs nothing of that global plan: a save
    deduplicates replicas itself (every tensor is registered as a replica)
    and the lowest rank holding a bytes item saves it; a load's global plan
    is its local plans. The Writer and Reader keep the local items and use
    them in write_data / read_data."""
    if keep_items:
        return plan
    return dataclasses.replace(plan, items=[], planner_data={})


def _resolver(planner):
    """planner.resolve_data, or a function that gives the same tensors
    without its cost where the planner is DefaultSavePlanner's own code
    (resolve_data, lookup_object and transform_object not overridden): a
    DTensor's local tensor directly (DTensor.__get_tensor_shard__ goes
    through to_local(), an autograd function, ~13 us per tensor, 300 of
    them in a model), a plain tensor itself. Anything else, and every bytes
    item, still goes through resolve_data."""
    cls = type(planner)
    if not isinstance(planner, DefaultSavePlanner) or any(
            getattr(cls, m) is not getattr(DefaultSavePlanner, m)
            for m in ("resolve_data", "lookup_object", "transform_object")):
        return planner.resolve_data
    from torch.distributed.tensor import DTensor
    state = planner.state_dict

    def resolve(item: WriteItem):
        v = state.get(item.index.fqn) if item.type != WriteItemType.BYTE_IO else None
        if type(v) is DTensor and type(v._local_tensor) is torch.Tensor and not any(
                p.is_partial() for p in v.placements):
            return v._local_tensor
        if type(v) is torch.Tensor and not any(item.index.offset or ()):
            return v
        return planner.resolve_data(item)
    return resolve


def _signature(item: WriteItem, data) -> Optional[tuple]:
    """The signature (ckpt.torch._registry) of the registration of tensor
    item `item` resolved to `data`, where the Writer would borrow `data`
    itself (_host_tensor copies nothing); None otherwise."""
    if not isinstance(data, torch.Tensor) or not data.is_contiguous() or (
            data.device.type != "cpu" and not (data.device.type == "cuda" and _ckpt.has_cuda)):
        return None
    chunk = item.tensor_data.chunk
    return tensor_signature(data, "dcp", tuple(item.tensor_data.size), tuple(chunk.offsets),
                            tuple(chunk.sizes))


def _resolve_all(items: Sequence[WriteItem], resolve) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(FQN -> resolved data, FQN -> signature / None / VALUE for a bytes
    item): what _register registers. resolve: _resolver(planner)."""
    data, sigs = {}, {}
    for item in items:
        fqn = item.index.fqn
        data[fqn] = d = resolve(item)
        sigs[fqn] = VALUE if item.type == WriteItemType.BYTE_IO else _signature(item, d)
    return data, sigs


def _register(writer, items: Sequence[WriteItem], resolve) -> Dict[str, bytes]:
    """Registers the tensor items with `writer` (a kept Writer: a tensor its
    last save registered the same way stays registered, ckpt.torch._registry)
    and synchronizes torch's current stream of every CUDA device they are
    on; returns the bytes items' bytes by FQN (not yet set). resolve:
    _resolver(planner)."""
    data, sigs = _resolve_all(items, resolve)
    regs = writer.registrations
    regs.begin(writer, sigs)
    blobs, devices = {}, set()
    for item in items:
        fqn, d = item.index.fqn, data[item.index.fqn]
        if item.type == WriteItemType.BYTE_IO:
            blobs[fqn] = d.getvalue() if isinstance(d, io.BytesIO) else bytes(d)
            continue
        td = item.tensor_data

        def add():  # called by regs.tensor unless kept
            if tuple(d.shape) != tuple(td.chunk.sizes):
                raise InvalidArgumentError(
                    f"entry '{fqn}': the planner resolved a tensor of shape {list(d.shape)} "
                    f"for a chunk of sizes {list(td.chunk.sizes)}")
            writer.add_tensor(fqn, _ckpt_dtype(fqn, d.dtype), tuple(td.size), _box(item),
                              _host_tensor(fqn, d), replica=True)
        regs.tensor(writer, fqn, sigs[fqn], add)
        if d.device.type == "cuda":
            devices.add(d.device)
    for device in devices:  # once per device, for kept and new registrations
        torch.cuda.current_stream(device).synchronize()
    return blobs


def _set_objects(writer, blobs: Dict[str, bytes], gathered: List[Dict], rank: int) -> None:
    """Sets the bytes items (`blobs`) this rank saves, the lowest rank of
    those holding each (`gathered`: every rank's "objects"), and ends the
    save's registrations."""
    for fqn, data in blobs.items():
        if min(r for r, g in enumerate(gathered) if fqn in g["objects"]) == rank:
            writer.registrations.value(writer, fqn, data)
    writer.registrations.end(writer)


def _write_results(items: Sequence[WriteItem], blobs: Dict[str, bytes]) -> Future:
    results = []
    for item in items:
        if item.type == WriteItemType.BYTE_IO:
            size = len(blobs.get(item.index.fqn, b""))
        else:
            size = item.tensor_storage_size() or 0
        results.append(WriteResult(index=item.index, size_in_bytes=size,
                                   storage_data=item.index.fqn))
    fut: Future = Future()
    fut.set_result(results)
    return fut


# One ckpt Writer per process group (the group object kept with it), reused
# by every save of that group: its staging memory, save plan and the
# registrations of its last save (ckpt.torch._registry) are kept, and
# with them the tensors that save registered, until ckpt.torch.release().
_writers: Dict[int, tuple] = {}


def _group_key(process_group, comm):
    return "no_dist" if comm is None else (process_group if process_group is not None
                                           else torch.distributed.group.WORLD)


def _group_writer(process_group, no_dist: bool):
    """(the ckpt Writer, its communicator or None) of `process_group`."""
    comm = None if no_dist else _communicator(process_group)
    key = _group_key(process_group, comm)
    cached = _writers.get(id(key))
    if cached is None or cached[0] is not key:
        cached = _writers[id(key)] = (key, _new_writer(comm), comm)
    return cached[1], cached[2]


def _release() -> None:
    """Frees the group Writers, their staging memory and the tensors their
    last saves registered (ckpt.torch.release() calls it)."""
    _writers.clear()
    _plans.clear()
    _docs.clear()


# The local plan of the last stage() of each process group (the group object
# kept with it, as in _writers): (the structure it was made for, the plan,
# its JSON metadata).
# DefaultSavePlanner's create_local_plan builds every write item anew (for a
# DTensor, its chunk from mesh and placements) although a trainer saves the
# same structure every time; stage() reuses the plan while the structure is
# the same, which skips that work on the trainer's thread.
_plans: Dict[int, tuple] = {}


def _plan_structure(planner, is_coordinator: bool):
    """What DefaultSavePlanner's local plan of `planner.state_dict` (set up)
    depends on, or None when it cannot say (a planner of another type or
    with non-default options, a ShardedTensor): per FQN the kind of value,
    and for a tensor its global shape, dtype, TensorProperties and (a
    DTensor) mesh and placements; the flattening map; the coordinator
    flag. Values themselves do not enter the plan (resolve_data reads
    them)."""
    from torch.distributed.tensor import DTensor
    if type(planner) is not DefaultSavePlanner or not planner.flatten_state_dict or getattr(
            planner, "_enable_plan_caching", False):
        return None
    out = [is_coordinator]
    for fqn, v in planner.state_dict.items():
        if isinstance(v, DTensor):
            local = v._local_tensor
            out.append((fqn, "d", tuple(v.shape), v.dtype, v.device_mesh, tuple(v.placements),
                        local.layout, local.requires_grad, local.is_pinned()))
        elif type(v) is torch.Tensor or type(v) is torch.nn.Parameter:
            out.append((fqn, "t", tuple(v.shape), v.dtype, v.layout, v.requires_grad,
                        v.is_pinned()))
        elif isinstance(v, torch.Tensor):
            return None  # a ShardedTensor or another tensor subclass
        else:
            out.append((fqn, "o"))
    out.append(planner.mappings)
    return out


# The metadata document of the last stage() of each process group (the
# group object kept with it): (its token, this rank's part of it, the
# document's metadata pairs). A trainer's every stage() merges the same
# parts: while every rank's part is the one it gave that document, the
# ranks exchange its token (bytes) instead of their parts (tens of KB each,
# all-gathered: every rank would receive every other rank's).
_docs: Dict[int, tuple] = {}


def _agreed_metadata(key, comm, meta: Dict[str, Any], gathered: List[Dict]) -> Dict[str, str]:
    """The metadata pairs of the document that merges every rank's part,
    after stage()'s exchange (`gathered`, in which each rank sent its part
    as "meta", or only the token of the group's last document as
    "meta_token" when its part is the one it gave that document). Every rank
    decides alike from `gathered`: one token on every rank reuses that
    document; otherwise the parts that were not sent are exchanged now."""
    tokens = {g.get("meta_token") for g in gathered}
    if len(tokens) == 1 and None not in tokens:  # this rank sent it too
        return _docs[id(key)][3]
    parts = [g.get("meta") for g in gathered]
    if any(p is None for p in parts):  # a rank sent a token: every part again
        parts = [g["meta"] for g in _exchange(comm, {"meta": meta})]
    pairs = _encode_metadata(_merge_metadata(parts))
    token = hashlib.blake2b("".join(pairs.values()).encode(), digest_size=16).hexdigest()
    _docs[id(key)] = (key, token, meta, pairs)
    return pairs


def _metadata_part(key, meta: Dict[str, Any]) -> Dict[str, Any]:
    """What this rank sends of its part in stage()'s exchange (see
    _agreed_metadata)."""
    cached = _docs.get(id(key))
    if cached is not None and cached[0] is key and cached[2] is meta:
        return {"meta_token": cached[1]}
    return {"meta": meta}


def _local_plan(key, planner, is_coordinator: bool) -> Tuple[SavePlan, Dict[str, Any]]:
    """(planner.create_local_plan() with its items checked, its JSON
    metadata), or those of the group's last stage() when the structure its
    plan was made for is the same (_plan_structure)."""
    structure = _plan_structure(planner, is_coordinator)
    cached = _plans.get(id(key))
    if structure is not None and cached is not None and cached[0] is key \
            and cached[1] == structure:
        planner.plan = cached[2]
        return cached[2], cached[3]
    plan = planner.create_local_plan()
    _check_items(plan.items)
    meta = _plan_metadata(plan)
    if structure is None:
        _plans.pop(id(key), None)
    else:
        _plans[id(key)] = (key, structure, plan, meta)
    return plan, meta


@dataclasses.dataclass
class _Staged:
    """A save that stage() started: write_data waits for it."""
    handle: Any
    path: str
    keys: set
    blobs: Dict[str, bytes]


def _fspath(p) -> str:
    return os.fspath(p).rstrip("/") or "/"


class Writer(StorageWriter, AsyncStager):
    """A DCP StorageWriter that saves a ckpt checkpoint: `path` is the root,
    `step` its step. process_group: the group DCP saves over (None: the
    default group when torch.distributed is initialised with several ranks);
    no_dist=True saves from this process alone (DCP's no_dist). overwrite:
    replace a committed checkpoint of this step (otherwise
    AlreadyExistsError). planner: the SavePlanner stage() plans with (that of
    dcp.async_save; default DefaultSavePlanner()). options: ckpt.SaveOptions
    fields (codec, zstd_level, io_threads, keep_last, metadata, ...)."""

    _synchronize_after_execute = False  # stage() returns once staged

    def __init__(self, path, step: int = 0, *, process_group=None, no_dist: bool = False,
                 overwrite: bool = False, planner: Optional[SavePlanner] = None, **options):
        super().__init__()
        from .. import save_options
        self.path = _fspath(path)
        self.step = int(step)
        self.process_group, self.no_dist, self.overwrite = process_group, no_dist, overwrite
        self.planner = planner
        self._user_metadata = dict(options.pop("metadata", {}) or {})
        if any(k == METADATA_KEY or k.startswith(METADATA_KEY + ".") for k in self._user_metadata):
            raise InvalidArgumentError(f"metadata key '{METADATA_KEY}' is the Writer's own")
        save_options(**options)  # TypeError for an unknown option, now
        self._options = options
        self._save_id = uuid.uuid4().hex
        self._comm = None
        self._staged: Optional[_Staged] = None
        self._local: Optional[SavePlan] = None  # prepare_local_plan's plan, its items kept

    # -- identity
    @property
    def checkpoint_id(self) -> str:
        """The checkpoint root."""
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        """True for a local path (ckpt writes POSIX files)."""
        try:
            return "://" not in os.fspath(checkpoint_id)
        except TypeError:
            return False

    def reset(self, checkpoint_id=None) -> None:
        """A new save; checkpoint_id (if given) is the new root."""
        if checkpoint_id:
            self.path = _fspath(checkpoint_id)
        self._save_id = uuid.uuid4().hex

    def storage_meta(self) -> StorageMeta:
        return StorageMeta(checkpoint_id=self.path, save_id=self._save_id)

    def __reduce__(self):
        raise UnimplementedError(
            "ckpt.torch.dcp.Writer cannot be pickled: use dcp.async_save with the thread "
            "executor (AsyncCheckpointerType.THREAD, the default)")

    # -- DCP's save sequence
    def set_up_storage_writer(self, is_coordinator: bool, *args, **kwargs) -> None:
        """Refuses use_collectives=False and a rank that is not DCP's."""
        if not kwargs.get("use_collectives", True):
            raise UnimplementedError(
                "dcp.save(use_collectives=False): a ckpt checkpoint is committed collectively")
        _, self._comm = _group_writer(self.process_group, self.no_dist)
        rank = 0 if self._comm is None else self._comm.rank
        if kwargs.get("rank") is not None and kwargs["rank"] != rank:
            raise InvalidArgumentError(
                f"DCP saves as rank {kwargs['rank']}, the Writer's group has this process as "
                f"rank {rank}: pass the same process_group (and no_dist) to both")

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Checks the items; hands DCP the plan with this rank's JSON
        metadata (storage_data) and, under a planner that plans globally as
        DefaultSavePlanner does, without its items (_local_items): they stay
        here for write_data."""
        _check_items(plan.items)
        keep = not _plans_globally_by_default(self.planner, DefaultSavePlanner)
        self._local = None if keep else plan
        return dataclasses.replace(_local_items(plan, keep), storage_data=_plan_metadata(plan))

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        """(coordinator) Refuses a committed step (unless async_save's stage()
        has staged this step: it checked the step already, and its save may
        have committed it before DCP's background thread gets here); hands
        every rank the JSON metadata of all plans (in storage_data)."""
        if self._staged is None:
            self._check_step_free()
        doc = _merge_metadata([p.storage_data for p in plans])
        return [dataclasses.replace(p, storage_data=doc) for p in plans]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        """Saves this rank's items; collective (every rank of the group): the
        checkpoint is committed when it returns."""
        if self._staged is not None:
            return self._finish_staged(plan)
        writer, comm = _group_writer(self.process_group, self.no_dist)
        rank = 0 if comm is None else comm.rank
        items = plan.items if self._local is None else self._local.items
        info, error, blobs = {"error": None}, None, {}
        try:
            if not isinstance(plan.storage_data, dict):
                raise FailedPreconditionError(
                    "write_data: the plan has no storage_data from prepare_global_plan")
            if self._local is not None and not _plans_globally_by_default(
                    planner, DefaultSavePlanner):
                raise UnimplementedError(
                    f"dcp.save's planner {type(planner).__name__} makes its own global plan "
                    "(or caches plans), which DCP made without the items: pass it to "
                    "ckpt.torch.dcp.Writer(planner=...) too, and the Writer hands DCP every item")
            blobs = _register(writer, items, _resolver(planner))
            info["objects"] = sorted(blobs)
        except Exception as e:  # reported to every rank below
            error, info["error"] = e, _error_info(e)
        try:
            gathered = _exchange(comm, info)
            _raise_if_any_rank_failed(gathered, error, f"save of {self.path}")
            _set_objects(writer, blobs, gathered, rank)
            writer.save(self.path, self.step, self._save_options(plan.storage_data))
        except BaseException:
            writer.clear()  # the next save registers everything anew
            raise
        return _write_results(plan.items, blobs)

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        """(coordinator) write_data committed the checkpoint. Where DCP
        planned without the items (_local_items), its Metadata (which
        dcp.save returns) is completed as Reader.read_metadata builds it,
        from the committed manifest."""
        if self._local is None:
            return
        from .. import step_path
        built = _metadata(_ckpt.Reader(step_path(self.path, self.step)), self._save_id)
        metadata.state_dict_metadata.update(built.state_dict_metadata)
        metadata.planner_data = built.planner_data

    # -- async_save: ckpt stages
    def stage(self, state_dict: Dict[str, Any]) -> Dict[str, Any]:
        """Plans the save, registers it and starts ckpt's save_async, which
        returns once every tensor is in ckpt's staging memory. Collective over
        the Writer's group. Returns `state_dict` with its containers copied."""
        writer, comm = _group_writer(self.process_group, self.no_dist)
        rank = 0 if comm is None else comm.rank
        key = _group_key(self.process_group, comm)
        planner = self.planner if self.planner is not None else DefaultSavePlanner()
        info, error, blobs, plan, meta = {"error": None}, None, {}, None, None
        try:
            planner.set_up_planner(state_dict, storage_meta=self.storage_meta(),
                                   is_coordinator=rank == 0)
            plan, meta = _local_plan(key, planner, rank == 0)
            if rank == 0:
                self._check_step_free()
            blobs = _register(writer, plan.items, _resolver(planner))
            info.update(_metadata_part(key, meta), objects=sorted(blobs))
        except Exception as e:  # reported to every rank below
            error, info["error"] = e, _error_info(e)
        try:
            gathered = _exchange(comm, info)
            _raise_if_any_rank_failed(gathered, error, f"staging of {self.path}")
            _set_objects(writer, blobs, gathered, rank)
            pairs = _agreed_metadata(key, comm, meta, gathered)
            handle = writer.save_async(self.path, self.step, self._save_options(pairs=pairs))
        except BaseException:
            writer.clear()  # the next save registers everything anew
            raise
        self._staged = _Staged(handle, self.path, {_key(i) for i in plan.items}, blobs)
        return _copy_containers(state_dict)

    def synchronize_staging(self) -> None:
        """Nothing: stage() returns once the snapshot is taken."""

    def close(self) -> None:
        """Nothing: the ckpt Writer of the group is kept for its next save."""

    def _finish_staged(self, plan: SavePlan) -> Future:
        staged, self._staged = self._staged, None
        staged.handle.wait()  # the commit's collectives run here, on every rank
        if staged.path != self.path:
            raise InvalidArgumentError(
                f"dcp.async_save(checkpoint_id={self.path!r}) differs from the root stage() "
                f"saved into ({staged.path!r}, committed): pass the root to Writer(path)")
        items = plan.items if self._local is None else self._local.items
        missing = [item.index.fqn for item in items if _key(item) not in staged.keys]
        if missing:
            raise InvalidArgumentError(
                f"DCP's plan asks for {len(missing)} items that stage() did not plan, e.g. "
                f"'{missing[0]}' (checkpoint {staged.path} step {self.step} was committed "
                "without them): pass async_save's planner to Writer(planner=...) too")
        return _write_results(plan.items, staged.blobs)

    # -- helpers
    def _check_step_free(self) -> None:
        from .. import step_path
        path = step_path(self.path, self.step)
        if not self.overwrite and self.step in _committed_steps(self.path):
            raise AlreadyExistsError(
                f"{path}: a checkpoint of step {self.step} exists (Writer(overwrite=True) "
                "replaces it, or choose another step)")

    def _save_options(self, doc: Optional[Dict[str, Any]] = None, pairs=None):
        """ckpt's SaveOptions, the metadata document `doc` (or its encoded
        `pairs`) with the user's metadata."""
        from .. import save_options
        metadata = dict(self._user_metadata)
        metadata.update(_encode_metadata(doc) if pairs is None else pairs)
        return save_options(overwrite=self.overwrite, metadata=metadata, **self._options)


def _copy_containers(value):
    """`value` with its dicts, lists and tuples copied (leaves shared)."""
    if isinstance(value, dict):
        return {k: _copy_containers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_containers(v) for v in value]
    if type(value) is tuple:
        return tuple(_copy_containers(v) for v in value)
    return value


# --- Reader -------------------------------------------------------------------

def _chunks(entry) -> List[ChunkStorageMetadata]:
    """The entry's stored boxes; one box covering the tensor when it is
    stored in flat ranges (DCP has no flat chunks; ckpt reshards them)."""
    regions = [region for region, _ in entry.chunks]
    if all(isinstance(r, _ckpt.Box) for r in regions) and regions:
        return [ChunkStorageMetadata(offsets=torch.Size(r.offset), sizes=torch.Size(r.size))
                for r in regions]
    shape = tuple(entry.shape)
    return [ChunkStorageMetadata(offsets=torch.Size([0] * len(shape)), sizes=torch.Size(shape))]


def _metadata(reader, load_id: str) -> Metadata:
    """DCP's Metadata of a ckpt checkpoint (its manifest and, when DCP wrote
    it, the JSON metadata)."""
    doc = _decode_metadata(reader.metadata)
    props = doc["properties"] if doc else {}
    state = {}
    for e in reader.entries():
        if e.kind == "object":
            state[e.name] = BytesStorageMetadata()
        else:
            state[e.name] = TensorStorageMetadata(
                properties=_properties(_torch_dtype(e.name, e.dtype), props.get(e.name, {})),
                size=torch.Size(e.shape), chunks=_chunks(e))
    if doc:
        planner_data = {k: tuple(v) for k, v in doc["planner_data"].items()}
    else:  # flat names: the key of each entry is its name
        planner_data = {name: (name,) for name in state}
    return Metadata(state_dict_metadata=state, planner_data=planner_data,
                    storage_meta=StorageMeta(checkpoint_id=reader.path, load_id=load_id),
                    version=CURRENT_DCP_VERSION)


def _as_torch_save(data: bytes, fqn: str, from_dcp: bool) -> io.BytesIO:
    """What the load planner's load_bytes reads (torch.load): the object's
    bytes as saved, or, for a ckpt.values object of a checkpoint DCP did not
    write, torch.save of its value."""
    if not from_dcp and not data.startswith(b"PK\x03\x04"):
        buf = io.BytesIO()
        torch.save(_values.decode(data, f"entry '{fqn}'"), buf)
        data = buf.getvalue()
    return io.BytesIO(data)


class Reader(StorageReader):
    """A DCP StorageReader of a ckpt checkpoint: `path` is a checkpoint root
    (`latest` is followed; step=N picks step N) or a step directory.
    io_threads: ckpt's reading threads per load. planner: dcp.load's
    planner when it makes its own global plan (overrides
    create_global_plan or finish_plan): the Reader then hands DCP every
    read item (otherwise it keeps them: _local_items)."""

    def __init__(self, path, *, step: Optional[int] = None, io_threads: int = 4,
                 planner: Optional[LoadPlanner] = None):
        super().__init__()
        self.path = _fspath(path)
        self.step = step
        self.io_threads = io_threads
        self.planner = planner
        self._reader = None
        self._load_id = uuid.uuid4().hex
        self._local: Optional[LoadPlan] = None  # prepare_local_plan's plan, its items kept

    @property
    def checkpoint_id(self) -> str:
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        """True when the path holds a ckpt checkpoint (MANIFEST) or root
        (`latest`)."""
        try:
            p = os.fspath(checkpoint_id)
        except TypeError:
            return False
        return any(os.path.isfile(os.path.join(p, f)) for f in ("MANIFEST", "latest"))

    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id:
            self.path = _fspath(checkpoint_id)
        self._reader = None
        self._load_id = uuid.uuid4().hex

    def read_metadata(self, *args, **_options) -> Metadata:
        """DCP's Metadata rebuilt from the manifest. NotFoundError naming the
        path when it holds no ckpt checkpoint. (No **kwargs: ckpt has no
        rank-local metadata for DCP to fall back to.) Opens the checkpoint
        afresh: a root's `latest` is followed anew by every load."""
        self._reader = None
        return _metadata(self._open(), self._load_id)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args,
                              **kwargs) -> None:
        self._open()

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """The plan for DCP, without its items where the planner plans
        globally as DefaultLoadPlanner does (_local_items): they stay here
        for read_data."""
        keep = not _plans_globally_by_default(self.planner, DefaultLoadPlanner)
        self._local = None if keep else plan
        return _local_items(plan, keep)

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        """Loads every item of `plan` (one ckpt load, blocks verified), into
        the planner's tensors and through its load_bytes."""
        if self._local is not None:
            if not _plans_globally_by_default(planner, DefaultLoadPlanner):
                raise UnimplementedError(
                    f"dcp.load's planner {type(planner).__name__} makes its own global plan, "
                    "which DCP made without the items: pass it to "
                    "ckpt.torch.dcp.Reader(planner=...) too, and the Reader hands DCP every item")
            plan = self._local
        reader = self._open()
        from_dcp = _decode_metadata(reader.metadata) is not None
        entries = {e.name: e for e in reader.entries()}
        pending = [_request(item, planner, entries) for item in plan.items]
        reader.load([req for _, req, _, _ in pending], allow_unrequested=True,
                    io_threads=self.io_threads, report_not_loaded=False)
        for item, req, dest, buf in pending:
            if item.type == LoadItemType.BYTE_IO:
                planner.load_bytes(item, _as_torch_save(req.value, item.storage_index.fqn,
                                                        from_dcp))
                continue
            if buf is not dest:
                dest.copy_(buf)
            planner.commit_tensor(item, dest)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _open(self):
        if self._reader is None:
            from .. import step_path
            path = self.path if self.step is None else step_path(self.path, self.step)
            try:
                self._reader = _ckpt.Reader(path, io_threads=self.io_threads)
            except NotFoundError as e:
                if os.path.isfile(os.path.join(path, ".metadata")):
                    raise NotFoundError(
                        f"{path}: a DCP checkpoint of FileSystemWriter (.metadata), not a ckpt "
                        "checkpoint: load it with FileSystemReader, or convert it with "
                        "ckpt-convert --from dcp") from e
                raise
        return self._reader


def _committed_steps(root: str) -> List[int]:
    """The committed steps under `root`, local or s3:// ([] when none)."""
    try:
        return list(_ckpt._committed_steps(root))
    except FileNotFoundError:
        return []


def _holds_its_elements(t: torch.Tensor) -> bool:
    """Whether ckpt may write `t`'s elements straight into its memory;
    otherwise (a negative-bit view, a subclass with its own dispatch, ...:
    _stored_as_elements) a load goes through a buffer and copy_, whose
    semantics are torch's."""
    try:
        _stored_as_elements("", t)
        return True
    except InvalidArgumentError:
        return False


def _request(item, planner: LoadPlanner, entries: Dict[str, Any]):
    """(item, its ckpt LoadRequest, the planner's tensor, the buffer ckpt
    fills: the tensor itself when it can)."""
    fqn = item.storage_index.fqn
    entry = entries.get(fqn)
    if entry is None:
        raise NotFoundError(f"entry '{fqn}': not in the checkpoint")
    if item.type == LoadItemType.BYTE_IO:
        return item, _ckpt.LoadRequest.for_object(fqn), None, None
    offsets = [int(a) + int(b) for a, b in zip(item.storage_index.offset, item.storage_offsets)]
    lengths = [int(n) for n in item.lengths]
    dest = planner.resolve_tensor(item).detach()
    if list(dest.shape) != lengths:
        raise InvalidArgumentError(
            f"entry '{fqn}': the planner resolved a tensor of shape {list(dest.shape)} for a "
            f"read of {lengths}")
    dtype = _torch_dtype(fqn, entry.dtype)
    direct = (_holds_its_elements(dest) and dest.device.type == "cpu" and dest.dtype == dtype
              and dest.is_contiguous())
    buf = dest if direct else torch.empty(lengths, dtype=dtype)
    req = _ckpt.LoadRequest(fqn, entry.dtype, tuple(entry.shape), _ckpt.Box(offsets, lengths),
                            _borrowable(buf))
    return item, req, dest, buf
