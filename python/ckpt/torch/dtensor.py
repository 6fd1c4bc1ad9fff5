"""DTensor and ShardedTensor values: each rank's local tensor as pieces of
the global tensor, at their global offsets.

A DTensor's placements (torch.distributed.tensor) give, for each tensor
dimension, the global indices its local tensor covers on this rank's mesh
coordinate, processed left to right over the mesh dimensions:
  * Replicate: all of them (every rank of that mesh dimension holds the
    same data: saved as a replica, written once by one holder);
  * Shard(d): chunk r of the indices so far along d, with torch.chunk's
    sizes (ceil(n / k); the last chunks may be smaller or empty);
  * _StridedShard(d, split_factor=f) (FSDP2 over tensor parallelism): the
    indices split into f chunks, each into k chunks, and chunk r of each,
    concatenated, as torch's DTensor defines it;
  * Partial: refused (a pending reduction is no tensor value).
The covered indices are split into runs of consecutive ones; the local
tensor covers the boxes of their cross product (one box for Shard and
Replicate, and for FSDP2 over tensor parallelism, even or uneven). The
result is checked against the local tensor's shape and, with a
_StridedShard, against torch's own compute_local_shape_and_global_offset,
so a placement this module does not understand fails loudly instead of
saving data at wrong offsets. Everything is computed on each rank from its
DTensor alone (no collective); a dimension's indices stay a range unless
a _StridedShard leaves gaps, so the cost does not grow with the size.

A ckpt Writer registers one region per entry and rank: a DTensor whose
local tensor is several boxes (a _StridedShard with gaps, which FSDP2 does
not make) is saved after to_one_box redistributes it; a load writes each
box where it belongs.

A ShardedTensor (torch.distributed._shard, from older FSDP state dicts)
lists its local shards with their offsets.

Nothing here imports torch.distributed.tensor: a value can only be a
DTensor when that module is already loaded.
"""
import functools
import itertools
import sys
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from .._errors import InvalidArgumentError

# A shard-like placement, as local_boxes takes it: (tensor dim, split
# factor); split factor 1 is Shard(dim). None is Replicate.
ShardSpec = Optional[Tuple[int, int]]


@dataclass(frozen=True)
class LocalBox:
    """A box of the global tensor that the local tensor holds contiguously
    along every dimension: global `offsets`, `sizes`, and where it starts
    in the local tensor (`local_offsets`)."""
    offsets: Tuple[int, ...]
    sizes: Tuple[int, ...]
    local_offsets: Tuple[int, ...]


@dataclass
class Piece:
    """One box of this rank's data: global `offsets`; `local` is the view
    of the local tensor that holds it (not necessarily contiguous)."""
    offsets: Tuple[int, ...]
    local: torch.Tensor


@dataclass
class Layout:
    """What a DTensor or ShardedTensor is on this rank."""
    global_shape: Tuple[int, ...]
    dtype: torch.dtype
    pieces: List[Piece]
    kind: str  # "DTensor" or "ShardedTensor"


def _loaded_class(module: str, name: str):
    mod = sys.modules.get(module)
    return getattr(mod, name, None) if mod is not None else None


def dtensor_class():
    """torch.distributed.tensor.DTensor, or None when that module is not
    loaded (then no value can be a DTensor)."""
    return _loaded_class("torch.distributed.tensor", "DTensor")


def sharded_tensor_class():
    """ShardedTensor, or None when its module is not loaded."""
    return _loaded_class("torch.distributed._shard.sharded_tensor", "ShardedTensor")


def is_distributed(value) -> bool:
    """Whether `value` is a DTensor or a ShardedTensor."""
    if not isinstance(value, torch.Tensor) or type(value) is torch.Tensor:
        return False
    classes = tuple(c for c in (dtensor_class(), sharded_tensor_class()) if c is not None)
    return bool(classes) and isinstance(value, classes)


# ---------------------------------------------------------------------------
# The offset computation: plain data in, plain data out (no mesh, no
# process group), so it can be tested on its own.

# A dimension's covered indices: a range while they are consecutive (Shard
# and Replicate: no per-element work, whatever the size), else a list.
Indices = Sequence[int]


def _chunks(indices: Indices, n: int) -> List[Indices]:
    """torch.chunk's split into n parts (ceil(len / n) each, the last ones
    shorter or empty)."""
    size = -(-len(indices) // n)
    return [indices[r * size:(r + 1) * size] for r in range(n)]


def _concat(parts: List[Indices]) -> Indices:
    """The parts one after the other: a range where they join up."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return range(0)
    if all(isinstance(p, range) and p.step == 1 for p in parts) and all(
            a.stop == b.start for a, b in zip(parts, parts[1:])):
        return range(parts[0].start, parts[-1].stop)
    return [i for p in parts for i in p]


def _split(indices: Indices, n: int, split_factor: int) -> List[Indices]:
    """The n parts of `indices` a shard-like placement makes (Shard for
    split_factor 1, else _StridedShard)."""
    if split_factor == 1:
        return _chunks(indices, n)
    second = [_chunks(first, n) for first in _chunks(indices, split_factor)]
    return [_concat([s[r] for s in second]) for r in range(n)]


def local_indices(global_shape: Sequence[int], mesh_shape: Sequence[int],
                  coordinate: Sequence[int], shards: Sequence[ShardSpec]
                  ) -> List[Indices]:
    """Per tensor dimension, the global indices the local tensor covers, in
    local order (a range where they are consecutive). shards[m] is the
    placement on mesh dimension m."""
    out: List[Indices] = [range(int(g)) for g in global_shape]
    for m, spec in enumerate(shards):
        if spec is not None:
            d, factor = spec
            out[d] = _split(out[d], int(mesh_shape[m]), factor)[int(coordinate[m])]
    return out


def _runs(idx: Indices, size: int) -> List[Tuple[int, int, int]]:
    """(global start, local start, length) of each run of consecutive
    indices; an empty dimension is one empty run at the global size."""
    if len(idx) == 0:
        return [(size, 0, 0)]
    if isinstance(idx, range):
        return [(idx.start, 0, len(idx))]
    starts = [0] + [k for k in range(1, len(idx)) if idx[k] != idx[k - 1] + 1]
    ends = starts[1:] + [len(idx)]
    return [(idx[a], a, b - a) for a, b in zip(starts, ends)]


def boxes_of(idx: List[Indices], global_shape: Sequence[int]) -> List[LocalBox]:
    """The boxes a local tensor covering indices `idx` (local_indices)
    holds, in local order. An empty local tensor is one empty box (offset
    = global size along its empty dimensions)."""
    runs = [_runs(i, int(g)) for i, g in zip(idx, global_shape)]
    if any(r[0][2] == 0 for r in runs):
        return [LocalBox(tuple(r[0][0] for r in runs),
                         tuple(sum(n for _, _, n in r) for r in runs),
                         (0,) * len(runs))]
    return [LocalBox(tuple(r[0] for r in combo), tuple(r[2] for r in combo),
                     tuple(r[1] for r in combo))
            for combo in itertools.product(*runs)]


def local_boxes(global_shape: Sequence[int], mesh_shape: Sequence[int],
                coordinate: Sequence[int], shards: Sequence[ShardSpec]) -> List[LocalBox]:
    """The boxes the local tensor of this mesh coordinate holds, in local
    order: one for Shard and Replicate placements, several where a
    _StridedShard leaves gaps."""
    return boxes_of(local_indices(global_shape, mesh_shape, coordinate, shards), global_shape)


# ---------------------------------------------------------------------------
# DTensor

def _shard_spec(name: str, placement) -> ShardSpec:
    """A DTensor placement as local_boxes takes it. InvalidArgumentError
    naming the entry for Partial and for placements it does not know."""
    if placement.is_partial():
        raise InvalidArgumentError(
            f"entry '{name}': a DTensor with a Partial placement ({placement}) holds "
            "pending sums, not values; redistribute it (e.g. to Replicate()) before saving")
    if placement.is_replicate():
        return None
    factor = getattr(placement, "split_factor", None)  # _StridedShard
    if factor is not None or placement.is_shard():
        return int(placement.dim), int(factor or 1)
    raise InvalidArgumentError(
        f"entry '{name}': unsupported DTensor placement {placement!r}")


def _local_tensor(dt) -> torch.Tensor:
    local = getattr(dt, "_local_tensor", None)
    return (local if local is not None else dt.to_local()).detach()


def _check_against_torch(name: str, dt, shape: Tuple[int, ...], local: torch.Tensor,
                         local_shape: Tuple[int, ...], first: Tuple[int, ...],
                         strided: bool) -> None:
    """The computed coverage (local_shape, at global offsets `first`) must
    give the local tensor's shape and (with a _StridedShard, a private
    placement whose meaning torch may change) torch's own first offsets;
    else this torch's placements mean something else. Shard's documented
    meaning is torch.chunk's: its local shape alone is checked, which costs
    nothing. shape: the DTensor's global shape."""
    theirs = None
    if strided:
        try:
            from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
            theirs = compute_local_shape_and_global_offset(shape, dt.device_mesh,
                                                           dt.placements)
        except ImportError:  # another torch: the local shape is still checked
            pass
    if local_shape != tuple(local.shape) or (
            theirs is not None and (tuple(theirs[0]), tuple(theirs[1])) != (local_shape, first)):
        raise InvalidArgumentError(
            f"entry '{name}': the DTensor's placements {tuple(dt.placements)} give local "
            f"shape {list(local_shape)} at {list(first)}, but its local tensor has shape "
            f"{list(local.shape)}" + (f" and torch computes {list(theirs[0])} at "
                                       f"{list(theirs[1])}" if theirs is not None else "")
            + "; this placement is not understood by ckpt")


@functools.lru_cache(maxsize=256)
def _cached_shard_specs(placements: Tuple) -> Optional[Tuple[ShardSpec, ...]]:
    """The ShardSpecs of placements, or None where one is refused (the
    caller then converts them again, naming its entry in the error)."""
    try:
        return tuple(_shard_spec("", p) for p in placements)
    except InvalidArgumentError:
        return None


def _shard_specs(name: str, placements) -> Tuple[ShardSpec, ...]:
    """The ShardSpecs of a DTensor's placements (cached by placements);
    InvalidArgumentError naming entry `name` for one it refuses."""
    placements = tuple(placements)
    try:
        shards = _cached_shard_specs(placements)
    except TypeError:  # a placement that cannot be hashed
        shards = None
    if shards is None:
        shards = tuple(_shard_spec(name, p) for p in placements)
    return shards


@functools.lru_cache(maxsize=4096)
def _cached_coverage(shape: Tuple[int, ...], mesh_shape: Tuple[int, ...],
                     coordinate: Tuple[int, ...], shards: Tuple[ShardSpec, ...]
                     ) -> Tuple[Tuple[int, ...], Tuple[int, ...], Tuple[LocalBox, ...]]:
    """(local shape, global offsets of its first element, boxes) of the
    local tensor at `coordinate`: pure, and the parameters of a model share
    few shapes and layouts (a save asks it of every DTensor, every step)."""
    idx = local_indices(shape, mesh_shape, coordinate, shards)
    first = tuple(i[0] if len(i) else g for i, g in zip(idx, shape))
    return tuple(len(i) for i in idx), first, tuple(boxes_of(idx, shape))


def _dtensor_layout(name: str, dt) -> Layout:
    mesh = dt.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise InvalidArgumentError(
            f"entry '{name}': this rank is not in the DTensor's mesh "
            f"{mesh.mesh.tolist()}")
    shards = _shard_specs(name, dt.placements)
    local = _local_tensor(dt)
    # size(), not .shape: a DTensor's shape property costs ~15 us (it goes
    # through __torch_function__), size() ~1 us, and a model has hundreds.
    shape = tuple(int(d) for d in dt.size())
    local_shape, first, boxes = _cached_coverage(shape, tuple(int(n) for n in mesh.shape),
                                                 tuple(int(c) for c in coordinate), shards)
    _check_against_torch(name, dt, shape, local, local_shape, first,
                         any(s is not None and s[1] > 1 for s in shards))
    if len(boxes) == 1:
        return Layout(shape, dt.dtype, [Piece(boxes[0].offsets, local)], "DTensor")
    pieces = [Piece(b.offsets, local[tuple(slice(o, o + s) for o, s in
                                           zip(b.local_offsets, b.sizes))])
              for b in boxes]
    return Layout(shape, dt.dtype, pieces, "DTensor")


def _sharded_tensor_layout(name: str, st) -> Layout:
    md = st.metadata()
    pieces = []
    for shard in st.local_shards():
        sizes = tuple(int(s) for s in shard.metadata.shard_sizes)
        if tuple(shard.tensor.shape) != sizes:
            raise InvalidArgumentError(
                f"entry '{name}': a ShardedTensor shard of sizes {list(sizes)} holds a "
                f"tensor of shape {list(shard.tensor.shape)}")
        pieces.append(Piece(tuple(int(o) for o in shard.metadata.shard_offsets),
                            shard.tensor.detach()))
    shape = tuple(int(d) for d in md.size)
    if not pieces:  # this rank holds nothing: one empty piece
        empty = torch.empty((0,) + shape[1:], dtype=md.tensor_properties.dtype)
        pieces.append(Piece((shape[0],) + (0,) * (len(shape) - 1), empty))
    return Layout(shape, md.tensor_properties.dtype, pieces, "ShardedTensor")


def local_tensors(value) -> List[torch.Tensor]:
    """The local tensors of a DTensor (one) or a ShardedTensor (one per
    local shard), detached; a Layout's pieces are views of them."""
    dt = dtensor_class()
    if dt is not None and isinstance(value, dt):
        return [_local_tensor(value)]
    return [shard.tensor.detach() for shard in value.local_shards()]


def layout(name: str, value) -> Layout:
    """This rank's pieces of a DTensor or ShardedTensor. InvalidArgumentError
    naming `name` for a Partial placement, a rank outside the mesh, or a
    layout that disagrees with torch's."""
    dt = dtensor_class()
    if dt is not None and isinstance(value, dt):
        return _dtensor_layout(name, value)
    return _sharded_tensor_layout(name, value)


# ---------------------------------------------------------------------------
# The process group of a save

def _group_ranks(group) -> List[int]:
    import torch.distributed as dist
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    return list(dist.get_process_group_ranks(group))


# id(DeviceMesh) -> (the mesh, its ranks): the memo of one save (see value_ranks).
MeshRanks = Dict[int, Tuple[Any, List[int]]]


def value_ranks(value, memo: Optional[MeshRanks] = None) -> List[int]:
    """The global ranks that hold pieces of a DTensor (its mesh) or a
    ShardedTensor (its process group). memo, a dict the caller keeps for
    one save, holds each mesh's ranks once: torch 2.13 builds
    DeviceMesh.mesh anew at every access (from its layout), and the
    DTensors of a model share one mesh (300 of them took 0.5 s of a 4-rank
    save_async's 1.0 s block on a 2-core machine)."""
    dt = dtensor_class()
    if dt is not None and isinstance(value, dt):
        mesh = value.device_mesh
        hit = memo.get(id(mesh)) if memo is not None else None
        if hit is not None and hit[0] is mesh:
            return hit[1]
        ranks = [int(r) for r in mesh.mesh.reshape(-1).tolist()]
        if memo is not None:
            memo[id(mesh)] = (mesh, ranks)  # the mesh is kept: its id stays its own
        return ranks
    return _group_ranks(getattr(value, "_process_group", None))


def check_in_group(name: str, value, group_ranks: Optional[Iterable[int]],
                   memo: Optional[MeshRanks] = None) -> None:
    """InvalidArgumentError naming `name` when ranks that hold pieces of
    `value` are outside the save's process group (their pieces would be
    missing, or saved by another save). group_ranks None: not known (a
    communicator that is not a torch process group), not checked. memo: as
    value_ranks'."""
    if group_ranks is None:
        return
    group = set(group_ranks)
    holders = value_ranks(value, memo)
    outside = sorted(set(holders) - group)
    if outside:
        kind = "mesh" if dtensor_class() is not None and isinstance(
            value, dtensor_class()) else "process group"
        raise InvalidArgumentError(
            f"entry '{name}': the {type(value).__name__}'s {kind} holds ranks {holders}, "
            f"but the save runs on ranks {sorted(group)} (ranks {outside} are not in its "
            "process group): save on a group that contains the whole mesh")


# ---------------------------------------------------------------------------
# Saving a layout of several boxes per rank

def one_box_everywhere(name: str, value) -> bool:
    """Whether every rank holds at most one box of `value` (a ckpt Writer
    registers one region per entry and rank). Only a DTensor with a
    _StridedShard placement can hold several; for it every coordinate of
    the mesh is checked, so that all its ranks agree."""
    dt = dtensor_class()
    if dt is None or not isinstance(value, dt):
        return len(value.local_shards()) <= 1
    shards = _shard_specs(name, value.placements)
    if all(s is None or s[1] == 1 for s in shards):
        return True
    return _one_box_at_every_coordinate(tuple(int(d) for d in value.size()),
                                        tuple(int(n) for n in value.device_mesh.shape), shards)


@functools.lru_cache(maxsize=4096)
def _one_box_at_every_coordinate(shape: Tuple[int, ...], mesh_shape: Tuple[int, ...],
                                 shards: Tuple[ShardSpec, ...]) -> bool:
    """Cached: the parameters of a model share few shapes and layouts."""
    return all(len(local_boxes(shape, mesh_shape, c, shards)) == 1
               for c in itertools.product(*(range(n) for n in mesh_shape)))


def to_one_box(value):
    """A DTensor equal to `value` whose every rank holds one box: each
    _StridedShard placement becomes Replicate. A collective over the mesh
    (every rank of it calls this) and a copy of the local data."""
    from torch.distributed.tensor import Replicate
    placements = [Replicate() if getattr(p, "split_factor", None) is not None else p
                  for p in value.placements]
    return value.redistribute(value.device_mesh, placements)
