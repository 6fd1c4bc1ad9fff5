"""Load: in place, cooperative over the group, strict over the union of
every rank's requests."""
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import _ckpt
from .. import values as _values
from .._errors import FailedPreconditionError, NotFoundError
from ._comm import _communicator, _error_info, _exchange, _raise_if_any_rank_failed
from ._leaves import (PER_RANK_METADATA_KEY, PerRank, _flatten, _is_tensor_leaf, _Leaf,
                      _load_parts, _mark_written, _Part)
from ._save import _sync_cuda_streams
from ._stateful import Statefuls


@dataclass
class _LoadPlan:
    # Request i is requests[i], of leaf leaves[i]: two lists rather than a
    # (leaf, request) tuple each (64 bytes a request, 2^20 of them in a
    # load of as many scalars).
    leaves: List[_Leaf] = field(default_factory=list)
    requests: List[Any] = field(default_factory=list)  # LoadRequest
    not_loaded: List[Tuple[str, str]] = field(default_factory=list)
    requested: set = field(default_factory=set)


class _Completion:
    """The completion of one tensor leaf that is loaded through several
    requests (a DTensor's boxes) or through buffers: once all its requests
    completed (on the I/O threads), copies the buffers into the real
    storage, then calls on_complete(name) if given."""

    def __init__(self, name: str, parts: List[_Part], on_complete):
        self._name, self._on_complete = name, on_complete
        self._copies = [(p.target, p.data) for p in parts if p.target is not None]
        self._left, self._lock = len(parts), threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            for target, loaded in self._copies:
                target.copy_(loaded.view(target.dtype))
            if self._on_complete is not None:
                self._on_complete(self._name)


def _tensor_requests(name: str, entry: str, v, on_complete) -> List[Any]:
    """The LoadRequests of a tensor leaf: one per region it holds (with a
    callback when several, or buffers, have to complete first)."""
    parts = _load_parts(name, v)
    callback = None
    if len(parts) > 1 or any(p.target is not None for p in parts):
        callback = _Completion(name, parts, on_complete)
    elif on_complete is not None:
        callback = (lambda n=name: on_complete(n))
    return [_ckpt.LoadRequest(entry, p.dtype, p.shape, p.region, p.data, on_complete=callback)
            for p in parts]


def _request(reader, leaf: _Leaf, rank: int, strict: bool, on_complete, plan: _LoadPlan):
    name = f"{leaf.name}@rank{rank}" if leaf.per_rank else leaf.name
    if reader.find(name) is None:
        why = (f"no value saved for rank {rank} (saved on {reader.world_size} ranks)"
               if leaf.per_rank else f"not in checkpoint {reader.path}")
        if strict:
            raise NotFoundError(f"entry '{leaf.name}': {why}")
        plan.not_loaded.append((leaf.name, why))
        return
    if _is_tensor_leaf(leaf.value):
        reqs = _tensor_requests(leaf.name, name, leaf.value, on_complete)
    else:
        reqs = [_ckpt.LoadRequest.for_object(name)]
    plan.leaves.extend(leaf for _ in reqs)
    plan.requests.extend(reqs)
    plan.requested.add(name)


def _plan_load(reader, state_dict: Dict, rank: int, strict: bool, filter, on_complete,
               expand=None):
    """This rank's requests, its destinations not loaded, and the checkpoint
    entries it leaves unrequested."""
    plan = _LoadPlan()
    for leaf in _flatten(state_dict, expand=expand):
        if filter is not None and not filter(leaf.name):
            plan.not_loaded.append((leaf.name, "excluded by filter"))
            continue
        _request(reader, leaf, rank, strict, on_complete, plan)
    per_rank = set(json.loads(dict(reader.metadata).get(PER_RANK_METADATA_KEY, "[]")))
    unrequested = []
    for name in reader.entry_names():  # names only: no Entry per entry
        base, sep, _ = name.rpartition("@rank")
        if name in plan.requested or (sep and base in per_rank):
            continue
        if filter is not None and not filter(name):
            continue
        unrequested.append(name)
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
    for name in reader.entry_names():
        base, sep, r = name.rpartition("@rank")
        if sep and base in per_rank and name not in taken:
            if filter is None or filter(base):
                out.append((name, f"saved by rank {r}; no loading rank has rank {r}"))
    return out


def _place(leaf: _Leaf, req) -> None:
    """Replaces a value in its dict (tensors were written in place: their
    version counters move on, as after copy_)."""
    if _is_tensor_leaf(leaf.value):
        _mark_written(leaf.name, leaf.value)
        return
    value = _values.decode(req.value, f"entry '{req.name}'")
    leaf.container[leaf.key] = PerRank(value) if leaf.per_rank else value


def _restore(statefuls: Statefuls, comm, any_rank_has_them: bool) -> None:
    """Hands every stateful value its loaded state; a failure on any rank
    raises on every rank (one more collective, run when any rank has
    stateful values)."""
    info, error = {"error": None}, None
    try:
        for s in statefuls.found:
            s.restore()
    except Exception as e:  # reported to every rank below
        error, info["error"] = e, _error_info(e)
    if any_rank_has_them:
        _raise_if_any_rank_failed(_exchange(comm, info), error, "load")
    elif error is not None:
        raise error


def load(state_dict: Dict, root: str, *, step: Optional[int] = None, process_group=None,
         strict: bool = True, filter: Optional[Callable[[str], bool]] = None,
         on_complete: Optional[Callable[[str], None]] = None) -> _ckpt.LoadReport:
    """Loads checkpoint `step` (default: `latest`) under `root` into
    `state_dict`, in place: the tensors (and Chunks' local tensors) are
    overwritten, Python values replaced in their dicts. Any sharding and
    world size may load any checkpoint.

    A DTensor or ShardedTensor gets every box its local tensor holds, from
    any saved layout, mesh shape or world size, written into its local
    tensor's storage: where a box's view of it is not contiguous (a
    non-contiguous local tensor, or a _StridedShard that leaves gaps
    across a later dimension) it is loaded into a buffer and copied into
    the view before the entry counts as complete. A stateful value
    (state_dict() and load_state_dict(): modules, optimizers, LR
    schedulers; ckpt.torch._stateful) is loaded as its state dict, in
    place, then handed back to it (load_state_dict, or
    torch.distributed.checkpoint.state_dict's set_model_state_dict and
    set_optimizer_state_dict, or set_state_dict for a module and the one
    optimizer that updates it): ct.load({"model": model, "optim": optim},
    root) restores both, like dcp.load. An error there names the entry and
    is raised on every rank.

    filter(name) False skips an entry on purpose (both the destination and
    the checkpoint entry). on_complete(name) is called for each tensor as
    soon as it is completely written and verified, from an I/O thread,
    before load returns (refresh derived copies there); an exception it
    raises fails the load with its message.

    strict (the default) checks over the union of all ranks' requests: a
    destination missing from the checkpoint raises ckpt.NotFoundError (a
    KeyError) and a checkpoint entry no rank requested raises
    ckpt.FailedPreconditionError; a PerRank value saved by a rank that no
    loading rank has is only reported. This differs from dcp.load, which
    ignores checkpoint entries no rank asked for: ckpt refuses them unless
    strict=False or a filter excludes them, so that nothing is left
    unloaded by accident (FIELD-LESSONS 2). The report's not_loaded lists every
    destination and entry that was not loaded, with the reason.
    Shape or dtype mismatches raise ckpt.InvalidArgumentError naming the
    entry and both values, as does a destination whose memory does not
    hold its elements (docs/PYTORCH.md) or a state dict that contains
    itself; corrupt data, and a stored Python value that is not a valid
    document (ckpt.values), ckpt.DataLossError naming the entry. Tensors
    are written in place; their version counters move on as after copy_.

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
    statefuls = Statefuls(state_dict)
    try:
        # With several ranks the load is cooperative: rank 0 reads the
        # manifest, each stored block is read once by one rank.
        reader = _ckpt.Reader(path, comm=comm if comm is not None and comm.size > 1 else None)
        plan, unrequested = _plan_load(reader, state_dict, rank, strict, filter, on_complete,
                                       expand=statefuls.expand)
        info.update(unrequested=unrequested, statefuls=bool(statefuls.found),
                    requested_per_rank=[n for n in plan.requested if "@rank" in n])
    except Exception as e:  # reported to every rank below
        error, info["error"] = e, _error_info(e)
    gathered = _exchange(comm, info)
    _raise_if_any_rank_failed(gathered, error, "load")
    report_extra = _check_union(gathered, reader, strict, filter)
    _sync_cuda_streams(plan.leaves)
    report = reader.load(plan.requests, allow_unrequested=True)
    placed = None
    for leaf, req in zip(plan.leaves, plan.requests):
        if leaf is placed:  # a tensor's second box: the tensor is done
            continue
        placed = leaf
        _place(leaf, req)
        if on_complete is not None and not _is_tensor_leaf(leaf.value):
            on_complete(leaf.name)
    _restore(statefuls, comm, any(g.get("statefuls") for g in gathered))
    report.not_loaded = plan.not_loaded + report_extra
    return report


def _step_path(root: str, step: int) -> str:
    from .. import step_path
    return step_path(root, step)

