"""The leaves of a state dict: what each value becomes in a checkpoint.

A nested dict of str keys is flattened with "." into entry names; a leaf is
a torch.Tensor (the whole tensor; ranks that hold the same name hold
replicas), a Chunk (this rank's piece of a larger tensor), a PerRank value,
or a Python value (ckpt.values)."""
import hashlib
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from .. import _ckpt
from .._errors import InvalidArgumentError

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
    return isinstance(v, (torch.Tensor, Chunk))


def _tensor_spec(name: str, v):
    """(ckpt dtype, global shape, region, contiguous CPU or CUDA tensor to
    borrow)."""
    t = v.local if isinstance(v, Chunk) else v
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"entry '{name}': Chunk.local must be a torch.Tensor, "
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
    if isinstance(v, Chunk):
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

