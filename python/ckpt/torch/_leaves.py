"""The leaves of a state dict: what each value becomes in a checkpoint.

A nested dict of str keys is flattened with "." into entry names; a leaf is
a torch.Tensor (the whole tensor; ranks that hold the same name hold
replicas), a DTensor or ShardedTensor (this rank's local pieces at their
global offsets: ckpt.torch.dtensor), a Chunk (this rank's piece of a larger
tensor), a PerRank value, or a Python value (ckpt.values)."""
import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .. import _ckpt
from .._errors import InvalidArgumentError
from .dtensor import is_distributed as _dtensor_is_distributed
from .dtensor import layout

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


def ckpt_dtype(dtype: torch.dtype, name: Optional[str] = None) -> _ckpt.DType:
    """The ckpt element type of a torch dtype. TypeError (naming entry
    `name` when given) if there is none."""
    try:
        return _DTYPES[dtype]
    except KeyError:
        where = f"entry '{name}': " if name is not None else ""
        raise TypeError(f"{where}torch dtype {dtype} has no ckpt element type") from None


# torch.func's predicates of this torch (looked up once: a save asks them
# of every tensor).
_FUNCTORCH_PREDICATES = tuple(
    p for p in (getattr(getattr(torch._C, "_functorch", None), n, None)
                for n in ("is_functorch_wrapped_tensor", "is_functionaltensor"))
    if p is not None)


def _functorch_wrapped(t: torch.Tensor) -> bool:
    """Whether `t` is a torch.func (vmap, grad, functionalize) wrapper."""
    for predicate in _FUNCTORCH_PREDICATES:
        if predicate(t):
            return True
    return False


def _stored_as_elements(name: str, t: torch.Tensor) -> None:
    """Refuses, with an InvalidArgumentError naming the entry, a tensor
    whose memory does not hold its elements as a strided array, which is
    all DLPack (and ckpt) can describe: a sparse, mkldnn or nested layout;
    a quantized tensor (its memory holds integers, the scale is elsewhere);
    a subclass with its own __torch_dispatch__ (FakeTensor,
    FunctionalTensor, torchao-style wrappers: their memory, if any, need
    not hold their values; subclasses that only override
    __torch_function__, like nn.Parameter, are plain tensors); a torch.func
    wrapper (inside vmap or grad); a negative-bit or conjugate view (its
    memory holds the negation or conjugate of its values). Save and load
    alike. DTensor and ShardedTensor never get here (their local tensors
    do)."""
    if t.is_nested or t.layout != torch.strided:
        kind = "nested" if t.is_nested else str(t.layout).replace("torch.", "").lstrip("_")
        raise InvalidArgumentError(
            f"entry '{name}': a {kind} tensor; ckpt saves and loads dense (strided) tensors, "
            "whose memory holds their elements: pass a dense tensor (e.g. tensor.to_dense(), "
            "or each component of a nested tensor)")
    if t.is_quantized:
        raise InvalidArgumentError(
            f"entry '{name}': a quantized tensor ({t.dtype}): its memory holds integers and "
            "its scale and zero point live elsewhere; save tensor.int_repr() and the "
            "quantization parameters, or tensor.dequantize()")
    if type(t).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__:
        raise InvalidArgumentError(
            f"entry '{name}': a {type(t).__module__}.{type(t).__qualname__}, a tensor "
            "subclass with its own __torch_dispatch__, whose memory need not hold its "
            "values; save plain tensors (its components, or a plain tensor of its values)")
    if _functorch_wrapped(t):
        raise InvalidArgumentError(
            f"entry '{name}': a tensor wrapped by a torch.func transform (vmap, grad, "
            "functionalize); save and load outside the transform")
    if t.is_neg() or t.is_conj():
        kind = "negative-bit" if t.is_neg() else "conjugate"
        raise InvalidArgumentError(
            f"entry '{name}': a {kind} view (e.g. z.conj().imag): its memory holds the "
            f"{'negation' if t.is_neg() else 'conjugate'} of its values; ckpt never copies "
            "silently: pass tensor.resolve_neg() / resolve_conj()")


def _overlaps(t: torch.Tensor) -> bool:
    """Whether two elements of `t` share memory (a zero stride, e.g. from
    expand(), or another as_strided overlap): a load cannot write into it."""
    if any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape)):
        return True
    check = getattr(torch, "_debug_has_internal_overlap", None)
    return check is not None and check(t) == 1



@dataclass
class Chunk:
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
                f"entry '{name}': a Chunk needs exactly one of offsets and flat_start")
        if self.flat_start is not None:
            if self.local.dim() != 1:
                raise InvalidArgumentError(
                    f"entry '{name}': a flat Chunk's local tensor must be 1-D, "
                    f"got shape {tuple(self.local.shape)}")
            total = 1
            for d in shape:
                total *= d
            start, n = int(self.flat_start), self.local.numel()
            if start < 0 or start + n > total:
                raise InvalidArgumentError(
                    f"entry '{name}': Chunk flat[{start}:{start + n}) lies outside the "
                    f"global shape {list(shape)} ({total} elements)")
            return _ckpt.FlatRange(start, n)
        offsets = tuple(int(o) for o in self.offsets)
        size = tuple(self.local.shape)
        if len(offsets) != len(shape) or len(size) != len(shape) or any(
                o < 0 or o + s > g for o, s, g in zip(offsets, size, shape)):
            box = ", ".join(f"{o}:{o + s}" for o, s in zip(offsets, size))
            raise InvalidArgumentError(
                f"entry '{name}': Chunk [{box}] lies outside the global shape {list(shape)}")
        return _ckpt.Box(offsets, size)


@dataclass
class PerRank:
    """One value per rank (RNG states, a data-loader position): saved as
    one entry per saving rank; each loading rank receives its own rank's
    value. `value` is a Python value or a tensor (loaded in place)."""
    value: Any


class _Leaf:
    """One value of a state dict. With __slots__ (not a dataclass, which
    has them only from Python 3.10): a load of 2^20 scalars holds as many
    leaves, and an instance dict each cost about 100 bytes more."""
    __slots__ = ("name", "container", "key", "value", "per_rank")

    def __init__(self, name: str, container: Dict, key: str, value: Any,
                 per_rank: bool = False):
        self.name = name            # entry name
        self.container = container  # the dict that holds the value (a load replaces it there)
        self.key = key
        self.value = value
        self.per_rank = per_rank

    def __repr__(self) -> str:
        return (f"_Leaf(name={self.name!r}, key={self.key!r}, value={self.value!r}, "
                f"per_rank={self.per_rank!r})")


def _flatten(state: Dict, prefix: str = "", expand: Optional[Callable] = None) -> List[_Leaf]:
    """The leaves of `state`, in order (depth first, without recursion: any
    depth). expand(name, key, value), when given, returns {key: state
    dict} to flatten in place of a value (a stateful object's), or None.
    InvalidArgumentError naming the entry for a dict that holds one of the
    dicts it is nested in (it would flatten forever)."""
    out: List[_Leaf] = []
    # (prefix, dict, its remaining items); `open_` holds the ids of the
    # dicts on the stack.
    stack = [(prefix, state, iter(state.items()))]
    open_ = {id(state)}
    while stack:
        prefix, d, items = stack[-1]
        item = next(items, None)
        if item is None:
            stack.pop()
            open_.discard(id(d))
            continue
        key, value = item
        if not isinstance(key, str):
            raise TypeError(f"state dict key {key!r:.60} under '{prefix}' is not a str "
                            "(nested dicts are flattened into entry names)")
        name = f"{prefix}{key}"
        holder = expand(name, key, value) if expand is not None else None
        if holder is not None:
            nested, nested_prefix = holder, prefix
        elif isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            nested, nested_prefix = value, name + "."
        else:
            nested = None
        if nested is not None:
            if id(nested) in open_:
                raise InvalidArgumentError(
                    f"entry '{name}': the dict holds a dict it is nested in (a state dict "
                    "that contains itself cannot be saved or loaded)")
            open_.add(id(nested))
            stack.append((nested_prefix, nested, iter(nested.items())))
        elif isinstance(value, PerRank):
            out.append(_Leaf(name, d, key, value.value, per_rank=True))
        else:
            out.append(_Leaf(name, d, key, value))
    return out


def _is_tensor_leaf(v) -> bool:
    """A tensor (plain, DTensor or ShardedTensor) or a Chunk."""
    return isinstance(v, (torch.Tensor, Chunk))


def _borrowable(name: str, t: torch.Tensor) -> torch.Tensor:
    """`t` as ckpt borrows it (no copy): detached, a CPU or CUDA tensor,
    contiguous, its memory holding its elements (_stored_as_elements:
    InvalidArgumentError naming the entry, for save and load alike), bool
    and float8 as same-width integers. TypeError naming the entry for a
    dtype ckpt lacks."""
    if t.requires_grad or type(t) is not torch.Tensor:
        # A plain tensor without autograd history is borrowed as it is: a
        # detached alias would cost a tensor object per request (2^20 of
        # them in a load of as many scalars) for nothing.
        t = t.detach()
    _stored_as_elements(name, t)
    ckpt_dtype(t.dtype, name)
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
    if t.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16,
                       torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
        t = t.view(_RAW_VIEW[t.element_size()])
    return t


def _tensor_spec(name: str, v):
    """(ckpt dtype, global shape, region, contiguous CPU or CUDA tensor to
    borrow) of a plain tensor or a Chunk."""
    t = v.local if isinstance(v, Chunk) else v
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"entry '{name}': Chunk.local must be a torch.Tensor, "
                        f"got {type(t).__name__}")
    data = _borrowable(name, t)
    dtype = ckpt_dtype(t.dtype, name)  # t's, not its raw view's
    if isinstance(v, Chunk):
        shape, region = tuple(int(d) for d in v.global_shape), v.region(name)
    else:
        shape = tuple(data.shape)
        region = _ckpt.Box.full(shape)
    return dtype, shape, region, data


@dataclass
class _Part:
    """One region of an entry on this rank: ckpt dtype, global shape,
    region, the tensor ckpt borrows, and (loads only) the non-contiguous
    view of the real storage to copy it into once loaded, or None."""
    dtype: Any
    shape: Tuple[int, ...]
    region: Any
    data: torch.Tensor
    target: Optional[torch.Tensor] = None


def _is_distributed(v) -> bool:
    return _dtensor_is_distributed(v)


def _distributed_save_part(name: str, v) -> _Part:
    """The one region this rank saves of a DTensor or ShardedTensor. A
    non-contiguous local tensor is saved from a contiguous copy. REQUIRES:
    the value holds one box here (dtensor.one_box_everywhere, else the
    caller redistributes it first)."""
    lay = layout(name, v)
    pieces = [p for p in lay.pieces if p.local.numel()] or lay.pieces[:1]
    if len(pieces) != 1:
        raise InvalidArgumentError(
            f"entry '{name}': this rank holds {len(pieces)} separate boxes of the "
            f"{lay.kind} (ckpt saves one region per entry and rank)")
    local = pieces[0].local  # detached (dtensor.layout); _borrowable checks it
    if not local.is_contiguous():
        _stored_as_elements(name, local)  # before the copy hides what it is
        local = local.contiguous()
    return _Part(ckpt_dtype(lay.dtype, name), lay.global_shape,
                 _ckpt.Box(pieces[0].offsets, tuple(local.shape)), _borrowable(name, local))


def _distributed_load_parts(name: str, v) -> List[_Part]:
    """The regions a load writes into this rank's local tensor of a DTensor
    or ShardedTensor: each box it holds, loaded in place, or (where the
    box's view of the local tensor is not contiguous) into a buffer that
    is then copied into the real storage. InvalidArgumentError naming the
    entry for a local tensor whose memory does not hold its elements
    (_stored_as_elements) or whose elements share memory (_overlaps)."""
    lay = layout(name, v)
    parts = []
    for p in lay.pieces:
        local, target = p.local, None  # detached (dtensor.layout)
        if not local.is_contiguous():  # else _borrowable checks it
            _stored_as_elements(name, local)
            if _overlaps(local):
                raise InvalidArgumentError(
                    f"entry '{name}': the local tensor's elements share memory (strides "
                    f"{local.stride()} for shape {tuple(local.shape)}); a load cannot write "
                    "into it")
            local, target = torch.empty(local.shape, dtype=local.dtype,
                                        device=local.device), local
        parts.append(_Part(ckpt_dtype(lay.dtype, name), lay.global_shape,
                           _ckpt.Box(p.offsets, tuple(p.local.shape)),
                           _borrowable(name, local), target))
    return parts


def _load_parts(name: str, v) -> List[_Part]:
    """The regions a load writes for a tensor leaf."""
    if _is_distributed(v):
        return _distributed_load_parts(name, v)
    return [_Part(*_tensor_spec(name, v))]


def _mark_written(name: str, v) -> None:
    """Tells autograd that a load wrote into tensor leaf `v` in place (as
    copy_ would: its version counter, which DLPack does not carry, moves
    on), so that a graph that saved its old values refuses to use them."""
    bump = getattr(torch.autograd.graph, "increment_version", None)
    if bump is None:  # torch < 2.1
        return
    if _is_distributed(v):
        from .dtensor import local_tensors
        tensors = local_tensors(v)  # a box of it is a view: one version counter
    else:
        tensors = [v.local if isinstance(v, Chunk) else v]
    for t in tensors:
        if not t.is_inference():
            bump(t)


def _digest(t: torch.Tensor) -> str:
    """Checksum of a contiguous tensor's bytes (a CUDA tensor is copied to
    the host for it: verify_replicas only)."""
    raw = t.reshape(-1).cpu().view(_RAW_VIEW[t.element_size()]).numpy()
    return hashlib.blake2b(memoryview(raw), digest_size=16).hexdigest()
