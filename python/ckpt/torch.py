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
  * a Shard: this rank's piece of a larger tensor (an n-d box or a flat
    range of the row-major flattening);
  * a PerRank(value): one value (or tensor) per rank;
  * any other value: a Python value (None, bool, int, float, str, bytes,
    and lists, tuples and dicts of them; ckpt.values documents the
    encoding: no pickle, loading never runs code). It must be equal on
    every rank that holds it.

Loads are in place: tensors of the state dict are written, Python values
are replaced in their dicts. A load reshards: any world size and any
sharding may load any checkpoint.

With several ranks, pass process_group (a torch.distributed group; None
means the default group when torch.distributed is initialised) or any ckpt
communicator (ckpt.MpiCommunicator, or an object with its methods).
"""

import hashlib
import json
import socket
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import _ckpt
from ._errors import (Error, FailedPreconditionError, InvalidArgumentError, NotFoundError,
                      error_class)
from . import values as _values

# The checkpoint metadata key listing the names saved as PerRank values
# (JSON list); entry "NAME@rankR" holds rank R's value of NAME.
PER_RANK_METADATA_KEY = "ckpt.torch.per_rank"

_DTYPES = {
    torch.bool: _ckpt.DType.bool,
    torch.uint8: _ckpt.DType.uint8,
    torch.int8: _ckpt.DType.int8,
    torch.int16: _ckpt.DType.int16,
    torch.int32: _ckpt.DType.int32,
    torch.int64: _ckpt.DType.int64,
    torch.float16: _ckpt.DType.float16,
    torch.bfloat16: _ckpt.DType.bfloat16,
    torch.float32: _ckpt.DType.float32,
    torch.float64: _ckpt.DType.float64,
}
for _t, _d in (("float8_e4m3fn", _ckpt.DType.float8_e4m3fn),
               ("float8_e5m2", _ckpt.DType.float8_e5m2)):
    if hasattr(torch, _t):  # torch >= 2.1
        _DTYPES[getattr(torch, _t)] = _d

# Same-width integer views: DLPack (torch 1.13) exports neither bool nor
# float8, and numpy has no bfloat16.
_RAW_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def ckpt_dtype(dtype: torch.dtype) -> _ckpt.DType:
    """The ckpt element type of a torch dtype. TypeError if there is none."""
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise TypeError(f"torch dtype {dtype} has no ckpt element type") from None


# ----------------------------------------------------------------------------
# Leaves of a state dict.

@dataclass
class Shard:
    """This rank's piece of a tensor of shape `global_shape`.

    Either an n-d box at `offsets` whose size is `local.shape`, or (with
    `flat_start`) elements [flat_start, flat_start + local.numel()) of the
    row-major flattening, `local` 1-D. `local` must be contiguous; a load
    writes exactly this region into it, from any saved sharding.
    """
    local: torch.Tensor
    global_shape: Sequence[int]
    offsets: Optional[Sequence[int]] = None
    flat_start: Optional[int] = None

    def region(self, name: str):
        """The ckpt.Box or ckpt.FlatRange of this piece. InvalidArgumentError
        naming `name` when it lies outside the global shape."""
        shape = tuple(int(d) for d in self.global_shape)
        if (self.offsets is None) == (self.flat_start is None):
            raise InvalidArgumentError(
                f"entry '{name}': a Shard needs exactly one of offsets and flat_start")
        if self.flat_start is not None:
            if self.local.dim() != 1:
                raise InvalidArgumentError(
                    f"entry '{name}': a flat Shard's local tensor must be 1-D, "
                    f"got shape {tuple(self.local.shape)}")
            total = 1
            for d in shape:
                total *= d
            start, n = int(self.flat_start), self.local.numel()
            if start < 0 or start + n > total:
                raise InvalidArgumentError(
                    f"entry '{name}': Shard flat[{start}:{start + n}) lies outside the "
                    f"global shape {list(shape)} ({total} elements)")
            return _ckpt.FlatRange(start, n)
        offsets = tuple(int(o) for o in self.offsets)
        size = tuple(self.local.shape)
        if len(offsets) != len(shape) or len(size) != len(shape) or any(
                o < 0 or o + s > g for o, s, g in zip(offsets, size, shape)):
            box = ", ".join(f"{o}:{o + s}" for o, s in zip(offsets, size))
            raise InvalidArgumentError(
                f"entry '{name}': Shard [{box}] lies outside the global shape {list(shape)}")
        return _ckpt.Box(offsets, size)


@dataclass
class PerRank:
    """One value per rank (RNG states, a data-loader position): saved as
    one entry per saving rank; each loading rank receives its own rank's
    value. `value` is a Python value or a tensor (loaded in place)."""
    value: Any


@dataclass
class _Leaf:
    name: str        # entry name
    path: Tuple      # keys from the state dict's root
    value: Any
    per_rank: bool = False


def _flatten(state: Dict, prefix: str = "", path: Tuple = ()) -> List[_Leaf]:
    out = []
    for key, value in state.items():
        if not isinstance(key, str):
            raise TypeError(f"state dict key {key!r} under '{prefix}' is not a str "
                            "(nested dicts are flattened into entry names)")
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            out.extend(_flatten(value, name + ".", path + (key,)))
        elif isinstance(value, PerRank):
            out.append(_Leaf(name, path + (key,), value.value, per_rank=True))
        else:
            out.append(_Leaf(name, path + (key,), value))
    return out


def _is_tensor_leaf(v) -> bool:
    return isinstance(v, (torch.Tensor, Shard))


def _tensor_spec(name: str, v):
    """(ckpt dtype, global shape, region, contiguous CPU or CUDA tensor to
    borrow)."""
    t = v.local if isinstance(v, Shard) else v
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"entry '{name}': Shard.local must be a torch.Tensor, "
                        f"got {type(t).__name__}")
    t = t.detach()
    dtype = ckpt_dtype(t.dtype)
    if not t.is_contiguous():
        raise InvalidArgumentError(
            f"entry '{name}': the tensor is not contiguous (strides {t.stride()} for shape "
            f"{tuple(t.shape)}); ckpt never copies silently: pass tensor.contiguous()")
    if t.device.type == "cuda" and not _ckpt.has_cuda:
        raise InvalidArgumentError(
            f"entry '{name}': a CUDA tensor, but this ckpt package was built without CUDA "
            "support (ckpt_gpu: the CUDA Toolkit was not found); pass tensor.cpu()")
    if t.device.type not in ("cpu", "cuda"):
        raise InvalidArgumentError(
            f"entry '{name}': a {t.device.type} tensor; ckpt saves and loads CPU and CUDA "
            "tensors")
    if isinstance(v, Shard):
        shape, region = tuple(int(d) for d in v.global_shape), v.region(name)
    else:
        shape = tuple(t.shape)
        region = _ckpt.Box.full(shape)
    if t.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16,
                       torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
        t = t.view(_RAW_VIEW[t.element_size()])
    return dtype, shape, region, t


def _digest(t: torch.Tensor) -> str:
    """Checksum of a contiguous tensor's bytes (a CUDA tensor is copied to
    the host for it: verify_replicas only)."""
    raw = t.reshape(-1).cpu().view(_RAW_VIEW[t.element_size()]).numpy()
    return hashlib.blake2b(memoryview(raw), digest_size=16).hexdigest()


# ----------------------------------------------------------------------------
# Communicators.

def _global_rank(group, group_rank: int) -> int:
    if group is None:
        return group_rank
    if hasattr(dist, "get_global_rank"):  # torch >= 2.0
        return dist.get_global_rank(group, group_rank)
    return dist.distributed_c10d._get_global_rank(group, group_rank)


class ProcessGroupCommunicator:
    """ckpt's collectives over a torch.distributed process group (gloo, or
    any backend with all_gather, broadcast, all_reduce, barrier and
    all_to_all_single on CPU tensors). Bytes travel as uint8 tensors, so
    dtypes a backend rejects (gloo: bfloat16) never reach it; unequal
    all-gathers are padded to the longest contribution; all_to_all moves
    each byte once. Ranks are ranks of `group`; node_name is the host name.
    """

    def __init__(self, group=None):
        if not (dist.is_available() and dist.is_initialized()):
            raise FailedPreconditionError(
                "ProcessGroupCommunicator: torch.distributed is not initialised")
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        # Ranks on one machine share its storage and network bandwidth: a
        # cooperative load spreads its reads over machines first.
        self.node_name = socket.gethostname()

    def _lengths(self, n: int) -> List[int]:
        mine = torch.tensor([n], dtype=torch.int64)
        lens = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        dist.all_gather(lens, mine, group=self.group)
        return [int(x) for x in lens]

    def all_gather(self, data: bytes) -> List[bytes]:
        lens = self._lengths(len(data))
        longest = max(max(lens), 1)
        buf = torch.zeros(longest, dtype=torch.uint8)
        if data:
            buf[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        outs = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.size)]
        dist.all_gather(outs, buf, group=self.group)
        return [o[:n].numpy().tobytes() for o, n in zip(outs, lens)]

    def broadcast(self, data: bytes, root: int) -> bytes:
        src = _global_rank(self.group, root)
        n = torch.tensor([len(data)], dtype=torch.int64)
        dist.broadcast(n, src, group=self.group)
        buf = torch.zeros(max(int(n), 1), dtype=torch.uint8)
        if self.rank == root and data:
            buf[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        dist.broadcast(buf, src, group=self.group)
        return buf[:int(n)].numpy().tobytes()

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def all_reduce_max(self, values: List[int]) -> List[int]:
        t = torch.tensor(list(values), dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return [int(x) for x in t]

    def all_to_all(self, parts: List[bytes]) -> List[bytes]:
        """parts[d] goes to rank d; returns the part every rank sent here,
        by rank. Two all_to_all_single calls (gloo has no list all_to_all):
        the sizes, then the concatenated parts with uneven splits, so each
        byte moves once. REQUIRES: len(parts) == size on every rank (ckpt
        checks it on every rank before calling)."""
        if len(parts) != self.size:
            raise InvalidArgumentError(
                f"all_to_all: {len(parts)} parts for {self.size} ranks")
        sent = [len(p) for p in parts]
        arriving = torch.empty(self.size, dtype=torch.int64)
        dist.all_to_all_single(arriving, torch.tensor(sent, dtype=torch.int64),
                               group=self.group)
        received = [int(n) for n in arriving]
        joined = b"".join(parts)
        send = (torch.frombuffer(bytearray(joined), dtype=torch.uint8) if joined
                else torch.empty(0, dtype=torch.uint8))
        out = torch.empty(sum(received), dtype=torch.uint8)
        dist.all_to_all_single(out, send, output_split_sizes=received,
                               input_split_sizes=sent, group=self.group)
        data, offsets = out.numpy().tobytes(), [0]
        for n in received:
            offsets.append(offsets[-1] + n)
        return [data[a:b] for a, b in zip(offsets, offsets[1:])]


def _communicator(process_group):
    """None (single process), a ckpt communicator, or a
    ProcessGroupCommunicator over `process_group`."""
    if process_group is None:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return ProcessGroupCommunicator(None)
        return None
    if hasattr(process_group, "all_gather") and hasattr(process_group, "all_reduce_max"):
        return process_group  # already a communicator
    return ProcessGroupCommunicator(process_group)


def _exchange(comm, info: Dict) -> List[Dict]:
    """Every rank's `info` (a JSON-able dict), in rank order."""
    if comm is None:
        return [info]
    return [json.loads(b) for b in comm.all_gather(json.dumps(info).encode())]


def _error_info(e: BaseException) -> Dict:
    code = next((c for c in range(1, 17) if type(e) is error_class(c)), 0)
    return {"message": f"{type(e).__name__}: {e}", "code": code}


def _raise_if_any_rank_failed(gathered: List[Dict], local_error, what: str) -> None:
    """Raises on every rank when one rank failed before a collective (so no
    rank waits in a collective the failed one never enters)."""
    if local_error is not None:
        raise local_error
    for r, g in enumerate(gathered):
        if g.get("error"):
            cls = error_class(g["error"]["code"]) if g["error"]["code"] else Error
            raise cls(f"{what}: rank {r} failed: {g['error']['message']}")


def _rank_list(ranks) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


# ----------------------------------------------------------------------------
# Save.

@dataclass
class _SavePlan:
    writer: Any
    options: Any
    root: str
    step: int


def _register(writer, leaves: List[_Leaf], rank: int) -> Tuple[Dict, Dict, Dict, List[str]]:
    """Registers this rank's tensors with `writer`. Returns the shared
    values (name -> bytes), their digests, the replicated tensors' digests
    (filled by the caller when verifying) and the per-rank names."""
    values, digests, replicas, per_rank = {}, {}, {}, []
    for leaf in leaves:
        name, v = leaf.name, leaf.value
        if leaf.per_rank:
            per_rank.append(name)
            entry = f"{name}@rank{rank}"
            if _is_tensor_leaf(v):
                dtype, shape, region, t = _tensor_spec(name, v)
                writer.add_tensor(entry, dtype, shape, region, t)
            else:
                writer.set_object(entry, _values.encode(v, f"entry '{name}'"))
        elif _is_tensor_leaf(v):
            dtype, shape, region, t = _tensor_spec(name, v)
            writer.add_tensor(name, dtype, shape, region, t, replica=not isinstance(v, Shard))
            if not isinstance(v, Shard):
                replicas[name] = t
        else:
            data = _values.encode(v, f"entry '{name}'")
            values[name] = data
            digests[name] = hashlib.blake2b(data, digest_size=16).hexdigest()
    return values, digests, replicas, per_rank


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
        t = leaf.value.local if isinstance(leaf.value, Shard) else leaf.value
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


def _writer(process_group, comm):
    """The Writer of `process_group`, emptied of the last save's entries."""
    key = _group_key(process_group)
    cached = _writers.get(id(key))
    if cached is None or cached[0] is not key:
        cached = _writers[id(key)] = (key, _ckpt.Writer(comm))
    cached[1].clear()
    return cached[1]


def release() -> None:
    """Waits for every save_async in flight, then frees the Writers that
    save and save_async keep for reuse (and their staging memory)."""
    for _, handle in list(_in_flight.values()):
        try:
            handle.wait()
        except Error:
            pass  # its outcome is reported by its own handle's wait()
    _in_flight.clear()
    _writers.clear()


def _plan_save(state_dict: Dict, root: str, step: int, comm, verify_replicas: bool,
               options: Dict, process_group=None) -> _SavePlan:
    """Registers everything and agrees with the other ranks (one collective):
    every rank's failure, the equality of Python values (and of replicas
    with verify_replicas), and which rank saves each value."""
    rank = comm.rank if comm is not None else 0
    writer = _writer(process_group, comm)
    info, error, values = {"error": None}, None, {}
    try:
        leaves = _flatten(state_dict)
        _sync_cuda_streams(leaves)
        values, digests, replicas, per_rank = _register(writer, leaves, rank)
        info.update(values=digests, per_rank=per_rank,
                    replicas={n: _digest(t) for n, t in replicas.items()}
                    if verify_replicas else {})
    except Exception as e:  # reported to every rank below
        error, info["error"] = e, _error_info(e)
    gathered = _exchange(comm, info)
    _raise_if_any_rank_failed(gathered, error, "save")
    _check_equal_across_ranks(gathered, "values", "Python values",
                              " (wrap per-rank values in ckpt.torch.PerRank)")
    _check_equal_across_ranks(gathered, "replicas", "replicated tensors",
                              " (verify_replicas=True compares the copies' checksums)")
    for name, data in values.items():  # the lowest rank holding a value saves it
        if min(r for r, g in enumerate(gathered) if name in g["values"]) == rank:
            writer.set_object(name, data)
    per_rank_names = sorted({n for g in gathered for n in g["per_rank"]})
    opts = dict(options)
    metadata = dict(opts.pop("metadata", {}) or {})
    if per_rank_names:
        metadata[PER_RANK_METADATA_KEY] = json.dumps(per_rank_names)
    from . import save_options
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
    entry; TypeError for an unsupported value type.
    """
    _await_in_flight(process_group)
    comm = _communicator(process_group)
    plan = _plan_save(state_dict, root, step, comm, verify_replicas, options, process_group)
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
    every rank calls it (or the next save, which calls it)."""

    def __init__(self, handle):
        self._handle = handle

    def wait(self) -> _ckpt.SaveResult:
        return self._handle.wait()

    def done(self) -> bool:
        return self._handle.done()


def save_async(state_dict: Dict, root: str, step: int, *, process_group=None,
               verify_replicas: bool = False, **options) -> SaveHandle:
    """As save, but returns a SaveHandle as soon as every tensor and value
    of `state_dict` has been snapshotted into ckpt's staging memory: from
    then on the trainer may modify its tensors (the optimizer step may run)
    and the checkpoint still holds the values at the call. Writing, fsyncs
    and the commit continue in the background with save's atomicity: until
    wait() succeeds, nothing of this step is visible.

    Every rank calls it. A save still in flight is waited for first. CUDA
    tensors are copied to pinned host memory before it returns (when the
    package was built with CUDA support). Errors before the snapshot (bad
    input, an existing step) are raised here; later ones by wait(). The GIL
    is released while the snapshot is taken and while wait() blocks.
    """
    _await_in_flight(process_group)
    comm = _communicator(process_group)
    plan = _plan_save(state_dict, root, step, comm, verify_replicas, options, process_group)
    handle = SaveHandle(plan.writer.save_async(plan.root, plan.step, plan.options))
    key = _group_key(process_group)
    _in_flight[id(key)] = (key, handle)
    return handle


# ----------------------------------------------------------------------------
# Load.

@dataclass
class _LoadPlan:
    requests: List[Tuple[_Leaf, Any]] = field(default_factory=list)  # (leaf, LoadRequest)
    not_loaded: List[Tuple[str, str]] = field(default_factory=list)
    requested: set = field(default_factory=set)


def _request(reader, leaf: _Leaf, rank: int, strict: bool, on_complete, plan: _LoadPlan):
    name = f"{leaf.name}@rank{rank}" if leaf.per_rank else leaf.name
    if reader.find(name) is None:
        why = (f"no value saved for rank {rank} (saved on {reader.world_size} ranks)"
               if leaf.per_rank else f"not in checkpoint {reader.path}")
        if strict:
            raise NotFoundError(f"entry '{leaf.name}': {why}")
        plan.not_loaded.append((leaf.name, why))
        return
    callback = None
    if on_complete is not None:
        callback = (lambda n=leaf.name: on_complete(n))
    if _is_tensor_leaf(leaf.value):
        dtype, shape, region, t = _tensor_spec(leaf.name, leaf.value)
        req = _ckpt.LoadRequest(name, dtype, shape, region, t, on_complete=callback)
    else:
        req = _ckpt.LoadRequest.for_object(name)
    plan.requests.append((leaf, req))
    plan.requested.add(name)


def _plan_load(reader, state_dict: Dict, rank: int, strict: bool, filter, on_complete):
    """This rank's requests, its destinations not loaded, and the checkpoint
    entries it leaves unrequested."""
    plan = _LoadPlan()
    for leaf in _flatten(state_dict):
        if filter is not None and not filter(leaf.name):
            plan.not_loaded.append((leaf.name, "excluded by filter"))
            continue
        _request(reader, leaf, rank, strict, on_complete, plan)
    per_rank = set(json.loads(dict(reader.metadata).get(PER_RANK_METADATA_KEY, "[]")))
    unrequested = []
    for e in reader.entries():
        base, sep, _ = e.name.rpartition("@rank")
        if e.name in plan.requested or (sep and base in per_rank):
            continue
        if filter is not None and not filter(e.name):
            continue
        unrequested.append(e.name)
    return plan, unrequested


def _check_union(gathered: List[Dict], reader, strict: bool, filter) -> List[Tuple[str, str]]:
    """Entries no rank requested (an error when strict) and saved per-rank
    values no loading rank took (reported, never an error)."""
    nobody = set(gathered[0]["unrequested"])
    for g in gathered[1:]:
        nobody &= set(g["unrequested"])
    if nobody and strict:
        names = sorted(nobody)
        shown = ", ".join(f"'{n}'" for n in names[:8]) + (", ..." if len(names) > 8 else "")
        raise FailedPreconditionError(
            f"strict load of {reader.path}: {len(names)} checkpoint entries requested by no "
            f"rank: {shown} (load them, pass a filter, or strict=False)")
    out = [(n, "not requested by any rank") for n in sorted(nobody)]
    per_rank = set(json.loads(dict(reader.metadata).get(PER_RANK_METADATA_KEY, "[]")))
    taken = {n for g in gathered for n in g["requested_per_rank"]}
    for e in reader.entries():
        base, sep, r = e.name.rpartition("@rank")
        if sep and base in per_rank and e.name not in taken:
            if filter is None or filter(base):
                out.append((e.name, f"saved by rank {r}; no loading rank has rank {r}"))
    return out


def _place(state_dict: Dict, leaf: _Leaf, req) -> None:
    """Replaces a value in its dict (tensors were written in place)."""
    if _is_tensor_leaf(leaf.value):
        return
    value = _values.decode(req.value, f"entry '{req.name}'")
    d = state_dict
    for k in leaf.path[:-1]:
        d = d[k]
    d[leaf.path[-1]] = PerRank(value) if leaf.per_rank else value


def load(state_dict: Dict, root: str, *, step: Optional[int] = None, process_group=None,
         strict: bool = True, filter: Optional[Callable[[str], bool]] = None,
         on_complete: Optional[Callable[[str], None]] = None) -> _ckpt.LoadReport:
    """Loads checkpoint `step` (default: `latest`) under `root` into
    `state_dict`, in place: the tensors (and Shards' local tensors) are
    overwritten, Python values replaced in their dicts. Any sharding and
    world size may load any checkpoint.

    filter(name) False skips an entry on purpose (both the destination and
    the checkpoint entry). on_complete(name) is called for each tensor as
    soon as it is completely written and verified, from an I/O thread,
    before load returns (refresh derived copies there); an exception it
    raises fails the load with its message.

    strict (the default) checks over the union of all ranks' requests: a
    destination missing from the checkpoint raises ckpt.NotFoundError (a
    KeyError) and a checkpoint entry no rank requested raises
    ckpt.FailedPreconditionError; a PerRank value saved by a rank that no
    loading rank has is only reported. The report's not_loaded lists every
    destination and entry that was not loaded, with the reason.
    Shape or dtype mismatches raise ckpt.InvalidArgumentError naming the
    entry and both values; corrupt data ckpt.DataLossError.

    With several ranks the load is cooperative (ckpt/reader.h): rank 0
    alone reads the manifest, each shard index and each stored block is
    read by one rank, and the bytes other ranks need travel through the
    group (its all_to_all), so that data-parallel replicas and resharded
    layouts read the checkpoint once. The report's bytes_read counts this
    rank's reads, bytes_received what it got from other ranks. An error on
    any rank raises the same error on every rank.
    """
    comm = _communicator(process_group)
    rank = comm.rank if comm is not None else 0
    path = root if step is None else _step_path(root, step)
    info, error, reader, plan = {"error": None}, None, None, None
    try:
        # With several ranks the load is cooperative: rank 0 reads the
        # manifest, each stored block is read once by one rank.
        reader = _ckpt.Reader(path, comm=comm if comm is not None and comm.size > 1 else None)
        plan, unrequested = _plan_load(reader, state_dict, rank, strict, filter, on_complete)
        info.update(unrequested=unrequested,
                    requested_per_rank=[n for n in plan.requested if "@rank" in n])
    except Exception as e:  # reported to every rank below
        error, info["error"] = e, _error_info(e)
    gathered = _exchange(comm, info)
    _raise_if_any_rank_failed(gathered, error, "load")
    report_extra = _check_union(gathered, reader, strict, filter)
    _sync_cuda_streams([leaf for leaf, _ in plan.requests])
    report = reader.load([req for _, req in plan.requests], allow_unrequested=True)
    for leaf, req in plan.requests:
        _place(state_dict, leaf, req)
        if on_complete is not None and not _is_tensor_leaf(leaf.value):
            on_complete(leaf.name)
    report.not_loaded = plan.not_loaded + report_extra
    return report


def _step_path(root: str, step: int) -> str:
    from . import step_path
    return step_path(root, step)


# ----------------------------------------------------------------------------
# Optimizers.

def _local_optimizer(optimizer):
    """The optimizer whose state this rank holds: a ZeroRedundancyOptimizer's
    partition (optimizer.optim), or the optimizer itself."""
    try:
        from torch.distributed.optim import ZeroRedundancyOptimizer
    except ImportError:  # torch built without distributed
        return optimizer
    return optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer


def _init_state(opt) -> None:
    """Creates an optimizer's lazily made state (one step at lr 0 with zero
    gradients), so that a load has tensors to fill. Parameters are left
    bit for bit unchanged for torch.optim's SGD, Adam and AdamW."""
    lrs = [g["lr"] for g in opt.param_groups]
    made = []
    for g in opt.param_groups:
        g["lr"] = 0.0
        for p in g["params"]:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
                made.append(p)
    try:
        opt.step()
    finally:
        for g, lr in zip(opt.param_groups, lrs):
            g["lr"] = lr
        for p in made:
            p.grad = None


def optimizer_state_dict(model: torch.nn.Module, optimizer) -> Dict[str, Any]:
    """The optimizer's state keyed by parameter names (model.named_parameters()),
    sharing its tensors and its per-parameter dicts: save it, or load into
    it in place, then call set_optimizer_state_dict for the hyperparameters.

    {"state": {param_name: {"exp_avg": tensor, "step": tensor, ...}},
     "param_groups": [{"lr": ..., "betas": ..., ...}, ...]}   # no "params"

    For a ZeroRedundancyOptimizer, only the partition this rank owns (no
    consolidation): each rank saves its own part, and a load under any world
    size requests the partition each rank owns then. An optimizer that has
    not stepped yet gets its state created first (zeros, at lr 0).
    """
    local = _local_optimizer(optimizer)
    names = {id(p): n for n, p in model.named_parameters()}
    if not local.state:
        _init_state(local)
    state = {}
    for g in local.param_groups:
        for p in g["params"]:
            if id(p) not in names:
                raise ValueError("optimizer_state_dict: the optimizer has a parameter "
                                 f"of shape {tuple(p.shape)} that is not in the model")
            if local.state.get(p):
                state[names[id(p)]] = local.state[p]
    groups = [{k: v for k, v in g.items() if k != "params"} for g in local.param_groups]
    return {"state": state, "param_groups": groups}


def set_optimizer_state_dict(model: torch.nn.Module, optimizer, state: Dict[str, Any]) -> None:
    """Puts a loaded optimizer_state_dict back into `optimizer`: the
    hyperparameters of its param groups and any per-parameter value that
    is not a tensor shared with it. ValueError for a different number of
    param groups."""
    local = _local_optimizer(optimizer)
    groups = state["param_groups"]
    if len(groups) != len(local.param_groups):
        raise ValueError(f"set_optimizer_state_dict: {len(groups)} saved param groups, the "
                         f"optimizer has {len(local.param_groups)}")
    targets = [local.param_groups]
    if local is not optimizer:
        targets.append(optimizer.param_groups)  # ZeRO copies its groups' values to local
    for target in targets:
        for g, saved in zip(target, groups):
            g.update({k: v for k, v in saved.items() if k != "params"})
    params = {n: p for n, p in model.named_parameters()}
    for name, st in state["state"].items():
        p = params[name]
        if local.state.get(p) is not st:
            local.state[p] = st
