"""Save and save_async: one ckpt Writer per process group, reused by
every save of that group (its staging memory and save plan are made once),
and at most one save in flight per group."""
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from .. import _ckpt
from .. import values as _values
from .._errors import Error, InvalidArgumentError
from ._comm import (ProcessGroupCommunicator, _communicator, _error_info, _exchange,
                    _raise_if_any_rank_failed, _rank_list)
from ._leaves import (PER_RANK_METADATA_KEY, Chunk, _digest, _distributed_save_part, _flatten,
                      _is_distributed, _is_tensor_leaf, _Leaf, _tensor_spec)
from ._registry import VALUE, Registrations, dtensor_signature, tensor_signature
from ._stateful import Statefuls
from .dtensor import _group_ranks, check_in_group, local_tensors, one_box_everywhere, to_one_box


@dataclass
class _SavePlan:
    writer: Any
    options: Any
    root: str
    step: int


def _register_distributed(writer, name: str, v, group_ranks, memo=None) -> bool:
    """Registers this rank's box of a DTensor or ShardedTensor, as a
    replica (ranks that hold the same box, e.g. along a Replicate mesh
    dimension, are written once, by one of them). Returns False, having
    registered nothing, for a DTensor that is not one box on every rank:
    the caller redistributes it once every rank is known to be ready.
    memo: the meshes' ranks of this save (dtensor.value_ranks)."""
    check_in_group(name, v, group_ranks, memo)
    if not one_box_everywhere(name, v):
        if not hasattr(v, "redistribute"):  # a ShardedTensor
            raise InvalidArgumentError(
                f"entry '{name}': this rank holds {len(v.local_shards())} shards of the "
                "ShardedTensor; ckpt saves one region per entry and rank")
        return False
    part = _distributed_save_part(name, v)
    writer.add_tensor(name, part.dtype, part.shape, part.region, part.data, replica=True)
    return True


def _signatures(leaves: List[_Leaf], rank: int, keep: bool) -> Dict[str, Any]:
    """Each leaf's entry name (a PerRank leaf's is NAME@rankR) and how it is
    registered: a tensor's signature (_registry.py; None where it has none,
    and for every tensor without `keep`), VALUE for a Python value."""
    sigs: Dict[str, Any] = {}
    for leaf in leaves:
        v = leaf.value
        if leaf.per_rank:
            entry = f"{leaf.name}@rank{rank}"
            if not _is_tensor_leaf(v) or _is_distributed(v):
                sigs[entry] = VALUE  # a PerRank DTensor is refused by _register
            else:
                sigs[entry] = (tensor_signature(v, "per-rank")
                               if keep and not isinstance(v, Chunk) else None)
        elif _is_distributed(v):
            sigs[leaf.name] = dtensor_signature(v) if keep else None
        elif _is_tensor_leaf(v):
            sigs[leaf.name] = (tensor_signature(v, "replica")
                               if keep and not isinstance(v, Chunk) else None)
        else:
            sigs[leaf.name] = VALUE
    return sigs


def _register(writer, leaves: List[_Leaf], rank: int, group_ranks, regs: Registrations,
              sigs: Dict[str, Any]) -> Tuple[Dict, Dict, Dict, List[str], List[_Leaf]]:
    """Registers this rank's tensors with `writer` (through `regs`, its
    Registrations begun with `sigs`, from _signatures: a tensor the last
    save registered the same way stays registered). Returns the shared
    values (name -> bytes), their digests, the replicated tensors (whose
    digests the caller takes when verifying: those registered again), the
    per-rank names, and the DTensor leaves to redistribute before
    registering (_register_deferred)."""
    values, digests, replicas, per_rank, deferred = {}, {}, {}, [], []
    meshes = {}  # each DTensor mesh's ranks, looked up once per save
    for leaf in leaves:
        name, v = leaf.name, leaf.value
        if leaf.per_rank:
            per_rank.append(name)
            entry = f"{name}@rank{rank}"
            if _is_distributed(v):
                raise InvalidArgumentError(
                    f"entry '{name}': a PerRank value cannot be a {type(v).__name__}")
            if _is_tensor_leaf(v):
                regs.tensor(writer, entry, sigs[entry], lambda: writer.add_tensor(
                    entry, *_tensor_spec(name, v)))
            else:
                regs.value(writer, entry, _values.encode(v, f"entry '{name}'"))
        elif _is_distributed(v):
            if not regs.tensor(writer, name, sigs[name], lambda: _register_distributed(
                    writer, name, v, group_ranks, meshes)):
                deferred.append(leaf)
        elif _is_tensor_leaf(v):
            chunk, spec = isinstance(v, Chunk), []

            def add():  # called at once, by regs.tensor, unless kept
                spec.extend(_tensor_spec(name, v))
                writer.add_tensor(name, *spec, replica=not chunk)
            regs.tensor(writer, name, sigs[name], add)
            if spec and not chunk:
                replicas[name] = spec[3]  # the tensor registered
        else:
            data = _values.encode(v, f"entry '{name}'")
            values[name] = data
            digests[name] = hashlib.blake2b(data, digest_size=16).hexdigest()
    return values, digests, replicas, per_rank, deferred


def _register_deferred(writer, deferred: List[_Leaf], regs: Registrations) -> None:
    """Registers the DTensors whose local tensors are several boxes (a
    _StridedShard that leaves gaps): each is redistributed, in name order
    on every rank of its mesh, to placements that hold one box (its
    _StridedShard placements become Replicate: a collective and a copy;
    the copy lives until the Writer is cleared, or the entry registered
    again). Called after every rank has registered everything else without
    error."""
    for leaf in sorted(deferred, key=lambda l: l.name):
        boxed = to_one_box(leaf.value)
        part = _distributed_save_part(leaf.name, boxed)
        regs.tensor(writer, leaf.name, None, lambda: writer.add_tensor(
            leaf.name, part.dtype, part.shape, part.region, part.data, replica=True))


def _save_group_ranks(comm) -> Optional[List[int]]:
    """The global ranks of the save's process group, or None where the
    communicator is not a torch process group (then DTensor meshes are
    not checked against it)."""
    if comm is None:
        return [dist.get_rank()] if dist.is_available() and dist.is_initialized() else [0]
    if isinstance(comm, ProcessGroupCommunicator):
        return _group_ranks(comm.group)
    return None


def _check_equal_across_ranks(gathered: List[Dict], key: str, what: str, hint: str) -> None:
    holders: Dict[str, Dict[str, List[int]]] = {}
    for r, g in enumerate(gathered):
        for name, d in g[key].items():
            holders.setdefault(name, {}).setdefault(d, []).append(r)
    for name in sorted(holders):
        if len(holders[name]) > 1:
            groups = " | ".join(_rank_list(rs) for rs in holders[name].values())
            raise InvalidArgumentError(
                f"entry '{name}': {what} differ between ranks (equal within each group: "
                f"{groups}){hint}")


def _sync_cuda_streams(leaves: List[_Leaf]) -> None:
    """ckpt copies device memory on its own CUDA streams: the kernels that
    produce (or, for a load, last use) the tensors, queued on torch's
    current stream of each device, must have completed first."""
    devices = set()
    for leaf in leaves:
        t = leaf.value.local if isinstance(leaf.value, Chunk) else leaf.value
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            devices.add(t.device)
    for d in devices:
        torch.cuda.current_stream(d).synchronize()


# One ckpt Writer per process group (the group object is kept with it),
# reused by every save of that group: its staging memory (allocated by the
# first save_async, or the first save of CUDA tensors) and its save plan
# are made once, not per save. release() drops them.
_writers: Dict[int, Tuple[Any, Any]] = {}


def _group_key(process_group):
    """What identifies the group of a save: the group (or communicator)
    passed, else the default group when torch.distributed is initialised
    with several ranks (a new one after re-initialisation), else None."""
    if process_group is None and _communicator(None) is not None:
        return dist.group.WORLD
    return process_group


def _writer(process_group, comm, device_snapshot_bytes: int = 0, staging_bytes: int = 0):
    """The Writer of `process_group`, holding the last save's entries (its
    Registrations say which; _plan_save keeps those registered the same
    way); made anew (the old one's memory freed first) when it has less
    device snapshot memory or a lower staging cap than asked
    (save_async)."""
    key = _group_key(process_group)
    cached = _writers.get(id(key))
    if cached is None or cached[0] is not key or not _fits(cached[1], device_snapshot_bytes,
                                                             staging_bytes):
        _writers.pop(id(key), None)
        cached = _writers[id(key)] = (key, _new_writer(comm, device_snapshot_bytes, staging_bytes))
    return cached[1]


def _fits(writer, device_snapshot_bytes: int, staging_bytes: int) -> bool:
    return (writer.device_snapshot_bytes >= device_snapshot_bytes
            and writer.staging_bytes >= staging_bytes)


class _KeptWriter(_ckpt.Writer):
    """A Writer kept for the next saves, with the Registrations of the
    last one (_registry.py); clear() forgets both."""

    def __init__(self, *args):
        super().__init__(*args)
        self.registrations = Registrations()

    def clear(self) -> None:
        super().clear()
        self.registrations.reset()


def _new_writer(comm, device_snapshot_bytes: int = 0, staging_bytes: int = 0) -> _KeptWriter:
    return _KeptWriter(comm, device_snapshot_bytes, max(staging_bytes, _DEFAULT_STAGING_BYTES))


# The staging cap of a Writer that no save_async asked more of (the C++
# default, Writer::Options::staging_bytes).
_DEFAULT_STAGING_BYTES = 4 << 30


def _snapshot_sizes(leaves: List[_Leaf], to_device: bool) -> Tuple[int, int]:
    """What save_async of a state dict with these leaves snapshots: (the
    bytes of its tensors, the staging cap under which the call never waits
    for a write; with `to_device`, the device memory its CUDA tensors need
    on the most loaded device, each rounded up to the snapshot's 256-byte
    alignment; else 0)."""
    total, per_device = 0, {}
    for leaf in leaves:
        t = leaf.value.local if isinstance(leaf.value, Chunk) else leaf.value
        if not isinstance(t, torch.Tensor):
            continue
        # A DTensor's local tensor directly: to_local() is an autograd
        # function (~13 us; 4 ms of a 300-DTensor save_async's block).
        for local in local_tensors(t) if _is_distributed(t) else (t,):
            n = local.numel() * local.element_size()
            total += n
            if to_device and local.device.type == "cuda":
                per_device[local.device] = (per_device.get(local.device, 0)
                                            + (n + 255) // 256 * 256)
    return total, max(per_device.values(), default=0)


def release() -> None:
    """Waits for every save_async in flight, then frees the Writers that
    save and save_async (and ckpt.torch.dcp.Writer's saves) keep for reuse:
    their staging memory and the tensors their last saves registered."""
    for _, handle in list(_in_flight.values()):
        try:
            handle.wait()
        except Error:
            pass  # its outcome is reported by its own handle's wait()
    _in_flight.clear()
    _writers.clear()
    dcp = sys.modules.get(__package__ + ".dcp")
    if dcp is not None:  # imported: its Writers too (never imported here: DCP is heavy)
        dcp._release()


def _plan_save(writer_for, state_dict: Dict, root: str, step: int, comm, verify_replicas: bool,
               options: Dict) -> _SavePlan:
    """Registers everything with writer_for(leaves) (the group's Writer,
    chosen once the state's leaves are known) and agrees with the other
    ranks (one collective): every rank's failure, the equality of Python
    values (and of replicas with verify_replicas), and which rank saves
    each value. Stateful values are saved as their state dicts
    (ckpt.torch._stateful)."""
    rank = comm.rank if comm is not None else 0
    info, error, values, deferred, writer, regs = {"error": None}, None, {}, [], None, None
    try:
        group_ranks = _save_group_ranks(comm)
        leaves = _flatten(state_dict, expand=Statefuls(state_dict).expand)
        writer = writer_for(leaves)
        regs = writer.registrations
        sigs = _signatures(leaves, rank, keep=not verify_replicas)
        regs.begin(writer, sigs)
        _sync_cuda_streams(leaves)
        values, digests, replicas, per_rank, deferred = _register(
            writer, leaves, rank, group_ranks, regs, sigs)
        info.update(values=digests, per_rank=per_rank,
                    replicas={n: _digest(t) for n, t in replicas.items()}
                    if verify_replicas else {})
    except Exception as e:  # reported to every rank below
        error, info["error"] = e, _error_info(e)
    try:
        gathered = _exchange(comm, info)
        _raise_if_any_rank_failed(gathered, error, "save")
        _register_deferred(writer, deferred, regs)
        _check_equal_across_ranks(gathered, "values", "Python values",
                                  " (wrap per-rank values in ckpt.torch.PerRank)")
        _check_equal_across_ranks(gathered, "replicas", "replicated tensors",
                                  " (verify_replicas=True compares the copies' checksums)")
        for name, data in values.items():  # the lowest rank holding a value saves it
            if min(r for r, g in enumerate(gathered) if name in g["values"]) == rank:
                regs.value(writer, name, data)
        regs.end(writer)
    except BaseException:
        if writer is not None:
            writer.clear()  # and its Registrations: the next save starts afresh
        raise
    per_rank_names = sorted({n for g in gathered for n in g["per_rank"]})
    opts = dict(options)
    metadata = dict(opts.pop("metadata", {}) or {})
    if per_rank_names:
        metadata[PER_RANK_METADATA_KEY] = json.dumps(per_rank_names)
    from .. import save_options
    return _SavePlan(writer, save_options(metadata=metadata, **opts), root, step)


# The handle of the last save_async of each process group (the group object
# is kept with it), until it was waited for: the next save of that group
# (sync or async) waits for it first, on every rank, so that at most one
# save is in flight and its commit (which may run the group's collectives
# inside wait()) is never overtaken by the next one.
_in_flight: Dict[int, Tuple[Any, "SaveHandle"]] = {}


def _await_in_flight(process_group) -> None:
    _, previous = _in_flight.pop(id(_group_key(process_group)), (None, None))
    if previous is not None:
        try:
            previous.wait()
        except Error:
            pass  # its outcome is reported by its own handle's wait()


def save(state_dict: Dict, root: str, step: int, *, process_group=None,
         verify_replicas: bool = False, **options) -> _ckpt.SaveResult:
    """Saves `state_dict` as checkpoint `step` under `root` (atomically;
    `latest` then names it). Every rank of the group calls it with its own
    state dict; it returns the same result (or raises the same error) on
    every rank.

    Leaves (ckpt.torch module docstring): plain tensors (replicas where
    several ranks hold the name), DTensors and ShardedTensors (each rank's
    box at its global offsets; boxes that several ranks hold, e.g. along a
    Replicate mesh dimension, are written once, by one holder chosen to
    balance the bytes; a non-contiguous local tensor is saved from a
    contiguous copy; a DTensor whose local tensor is several boxes, from a
    _StridedShard that leaves gaps, is first redistributed to one box per
    rank, a collective over its mesh), Chunks, PerRank and Python values.
    Stateful values (state_dict() and load_state_dict(): modules,
    optimizers, LR schedulers) are saved as their state dicts
    (ckpt.torch._stateful). Errors naming the entry: a DTensor with a
    Partial placement, a DTensor whose mesh has ranks outside the process
    group of the save, a state_dict() that raises (on every rank).

    options are ckpt.SaveOptions fields: codec ("none", "zstd"), zstd_level,
    io_threads, block_size, alignment, direct_io, overwrite, keep_last,
    reuse_recorded_plan, snapshot_threads, metadata (a dict of str).
    verify_replicas=True compares the checksums of the copies of replicated
    tensors and raises naming the ranks whose copies differ.

    The tensors are read during the call and may change once it returns.
    A save_async still in flight is waited for first. One ckpt Writer per
    process group is kept for the next saves (its staging memory and save
    plan reused); release() frees it. Raises
    ckpt.InvalidArgumentError (a ValueError) for bad input, naming the
    entry: among others a tensor whose memory does not hold its elements
    (sparse, quantized, a __torch_dispatch__ subclass, a negative-bit view:
    docs/PYTORCH.md), a state dict or Python value that contains itself, a
    value nested deeper than ckpt.values.MAX_DEPTH; TypeError naming the
    entry for an unsupported value type or dtype.
    """
    _await_in_flight(process_group)
    comm = _communicator(process_group)
    plan = _plan_save(lambda _: _writer(process_group, comm), state_dict, root, step, comm,
                      verify_replicas, options)
    return plan.writer.save(plan.root, plan.step, plan.options)


class SaveHandle:
    """What save_async returns: the save goes on in the background.

    wait() blocks until the checkpoint is committed and durable and returns
    its ckpt.SaveResult (stall_seconds: how long save_async blocked;
    peak_staging_bytes), or raises the error of the background (a storage
    error, a failing rank: the same on every rank; nothing is committed).
    Later calls return (or raise) the same. done() never blocks: True once
    wait() would not wait for I/O. With several ranks and no dedicated
    background communicator the commit's collectives run inside wait(), so
    every rank calls it (or the next save, which calls it).

    As a concurrent.futures.Future: result(timeout) is wait() that gives up
    with TimeoutError after `timeout` seconds of I/O (the save goes on; call
    it again), and exception(timeout) returns the error instead of raising
    it (None on success)."""

    def __init__(self, handle):
        self._handle = handle

    def wait(self) -> _ckpt.SaveResult:
        return self._handle.wait()

    def done(self) -> bool:
        return self._handle.done()

    def result(self, timeout: Optional[float] = None) -> _ckpt.SaveResult:
        if timeout is not None:
            deadline = time.monotonic() + timeout
            while not self._handle.done():
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"the save is still writing after {timeout} s")
                time.sleep(min(0.005, max(0.0, deadline - time.monotonic())))
        return self._handle.wait()

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        try:
            self.result(timeout)
        except TimeoutError:
            raise
        except Exception as e:  # noqa: BLE001 - the save's error, returned
            return e
        return None


def save_async(state_dict: Dict, root: str, step: int, *, process_group=None,
               verify_replicas: bool = False, **options) -> SaveHandle:
    """As save, but returns a SaveHandle as soon as every tensor and value
    of `state_dict` has been snapshotted into ckpt's staging memory: from
    then on the trainer may modify its tensors (the optimizer step may run)
    and the checkpoint still holds the values at the call. Writing, fsyncs
    and the commit continue in the background with save's atomicity: until
    wait() succeeds, nothing of this step is visible.

    Every rank calls it. A save still in flight is waited for first. The
    group's Writer keeps staging memory for the whole state (its cap is
    raised to the state's tensor bytes when they exceed 4 GiB, so that the
    call never waits for writes; ckpt.torch.release() frees it). CUDA
    tensors are copied to pinned host memory before it returns (when the
    package was built with CUDA support). Errors before the snapshot (bad
    input, an existing step) are raised here; later ones by wait(). The GIL
    is released while the snapshot is taken and while wait() blocks.

    snapshot_to_device=True: CUDA tensors are snapshotted into spare device
    memory (a device-to-device copy, the stall) and copied to host staging
    memory in the background. The group's Writer then keeps device memory
    of the size of this rank's CUDA tensors on its most loaded device
    (allocated by the first such save, reused, freed by release()); tensors
    that do not fit, or a device without that much free memory, take the
    copy to pinned host memory before the call returns, as without it.
    """
    _await_in_flight(process_group)
    comm = _communicator(process_group)
    to_device = bool(options.get("snapshot_to_device"))

    def writer_for(leaves):
        staging, device = _snapshot_sizes(leaves, to_device)
        return _writer(process_group, comm, device, staging)
    plan = _plan_save(writer_for, state_dict, root, step, comm, verify_replicas, options)
    handle = SaveHandle(plan.writer.save_async(plan.root, plan.step, plan.options))
    key = _group_key(process_group)
    _in_flight[id(key)] = (key, handle)
    return handle

