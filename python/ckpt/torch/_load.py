"""Load: in place, cooperative over the group, strict over the union of
every rank's requests."""
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import _ckpt
from .. import values as _values
from .._errors import FailedPreconditionError, NotFoundError
from ._comm import _communicator, _error_info, _exchange, _raise_if_any_rank_failed
from ._leaves import PER_RANK_METADATA_KEY, PerRank, _flatten, _is_tensor_leaf, _Leaf, _tensor_spec
from ._save import _sync_cuda_streams


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
    from .. import step_path
    return step_path(root, step)

