"""The PyTorch state the peer benchmarks save and load, generated at run time.

A transformer-like model (token embedding and output head in float32; per
layer two LayerNorms in float32 and attention qkv/out and MLP up/down
projections in bfloat16) with AdamW state (exp_avg and exp_avg_sq of each
parameter's dtype, a float32 step), about --gib GiB in all. Every tensor
holds values that are a pure function of its state-dict path and of the
element's global index (value()), so that any layout on any number of
processes can build what it should hold and check a load bit for bit
without a copy of the whole state.

Names are the flattened state-dict paths that dcp.save and ckpt.torch use:
"model.<fqn>", "optim.state.<fqn>.exp_avg", ...
"""
import zlib
from typing import Dict, List, Tuple

import torch

VOCAB_PER_HIDDEN = 8  # vocabulary = 8 * hidden


def dims(gib: float) -> Tuple[int, int]:
    """(hidden, layers) for a state of about `gib` GiB: per unit hidden^2,
    a layer holds 72 bytes (12 h^2 bf16 weights, three copies), the
    embedding and head 192 (2 x 8 h^2 float32, three copies)."""
    hidden = 1024 if gib >= 0.25 else 512 if gib >= 0.06 else 256 if gib >= 0.015 else 128
    units = gib * 2**30 / hidden**2
    return hidden, max(1, round((units - 192) / 72))


class Block(torch.nn.Module):
    def __init__(self, h: int):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(h)
        self.qkv = torch.nn.Linear(h, 3 * h, bias=False, dtype=torch.bfloat16)
        self.out = torch.nn.Linear(h, h, bias=False, dtype=torch.bfloat16)
        self.norm2 = torch.nn.LayerNorm(h)
        self.up = torch.nn.Linear(h, 4 * h, bias=False, dtype=torch.bfloat16)
        self.down = torch.nn.Linear(4 * h, h, bias=False, dtype=torch.bfloat16)


class Model(torch.nn.Module):
    def __init__(self, hidden: int, layers: int):
        super().__init__()
        vocab = VOCAB_PER_HIDDEN * hidden
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.layers = torch.nn.ModuleList(Block(hidden) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)


def build_fsdp2(hidden: int, layers: int):
    """The model on the current process group, FSDP2-sharded (Shard(0) of
    every parameter; one fully_shard per Linear or LayerNorm so that each
    group holds one dtype), and an AdamW whose state exists (one step with
    zero gradients). Values are not set: fill() does that."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    with torch.device("meta"):
        model = Model(hidden, layers)
    for m in model.modules():
        if isinstance(m, (torch.nn.Linear, torch.nn.LayerNorm, torch.nn.Embedding)):
            fully_shard(m)
    fully_shard(model)
    model.to_empty(device="cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    for p in model.parameters():
        local = torch.zeros_like(p.to_local())
        p.grad = DTensor.from_local(local, p.device_mesh, p.placements, run_check=False,
                                    shape=p.shape, stride=p.stride())
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt


def full_state(hidden: int, layers: int) -> Dict[str, torch.Tensor]:
    """The whole state as one flat dict of plain tensors (single process),
    with the names of the sharded state and their values."""
    model = Model(hidden, layers)  # parameter shapes and dtypes only
    out = {}
    for fqn, p in model.named_parameters():
        out[f"model.{fqn}"] = value(f"model.{fqn}", p.shape, (0,) * p.dim(), p.shape, p.dtype)
        for k in ("exp_avg", "exp_avg_sq"):
            name = f"optim.state.{fqn}.{k}"
            out[name] = value(name, p.shape, (0,) * p.dim(), p.shape, p.dtype)
        out[f"optim.state.{fqn}.step"] = value(f"optim.state.{fqn}.step", (), (), (),
                                              torch.float32)
    return out


def value(name: str, shape, offset, local_shape, dtype) -> torch.Tensor:
    """The values of the box [offset, offset + local_shape) of the tensor
    `name` of global `shape`: a function of the name and of each element's
    row-major global index, finite, with every mantissa bit in use."""
    seed = (zlib.crc32(name.encode()) % 1000003) / 1000003
    if len(shape) == 0:
        return torch.tensor(1.0 + seed, dtype=dtype)
    idx = torch.zeros((), dtype=torch.float64)
    stride = 1
    for d in reversed(range(len(shape))):
        r = torch.arange(offset[d], offset[d] + local_shape[d], dtype=torch.float64) * stride
        idx = idx + r.reshape([-1] + [1] * (len(shape) - 1 - d))
        stride *= shape[d]
    x = torch.frac(idx * 0.6180339887498949 + seed)
    x = torch.frac(x * 977.0 + seed * 31.0)
    return (x * 2.0 - 1.0).to(dtype).reshape(local_shape)


def box(t: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, ...], Tuple[int, ...]]:
    """(local tensor, global shape, global offset) of a tensor or DTensor."""
    if hasattr(t, "to_local"):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
        local = t.to_local()
        _, off = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
        return local, tuple(t.shape), tuple(off)
    return t, tuple(t.shape), (0,) * t.dim()


def leaves(sd, prefix="") -> List[Tuple[str, torch.Tensor]]:
    """(path, tensor) of every tensor of a nested state dict, by path."""
    out = []
    if isinstance(sd, dict):
        for k, v in sd.items():
            out += leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(sd, torch.Tensor):
        out.append((prefix, sd))
    return out


def fill(sd) -> None:
    """Writes value() into every tensor of the nested state dict, in place."""
    with torch.no_grad():
        for name, t in leaves(sd):
            local, shape, off = box(t)
            local.copy_(value(name, shape, off, tuple(local.shape), local.dtype))


def snapshot(sd) -> Dict[str, torch.Tensor]:
    """A copy of this process's local tensors (the reference of check())."""
    return {name: box(t)[0].detach().clone() for name, t in leaves(sd)}


def expected(sd) -> Dict[str, torch.Tensor]:
    """What this process's local tensors of `sd` must hold (any layout)."""
    out = {}
    for name, t in leaves(sd):
        local, shape, off = box(t)
        out[name] = value(name, shape, off, tuple(local.shape), local.dtype)
    return out


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def differences(sd, ref: Dict[str, torch.Tensor]) -> List[str]:
    """The paths whose local tensor differs from `ref` in any bit (or is
    missing), sorted."""
    got = dict(leaves(sd))
    bad = []
    for name, want in ref.items():
        t = got.get(name)
        if t is None or not torch.equal(bits(box(t)[0]), bits(want)):
            bad.append(name)
    return sorted(bad)


def scramble(sd) -> None:
    """Overwrites every local tensor (a load must write all of them)."""
    with torch.no_grad():
        for _, t in leaves(sd):
            box(t)[0].fill_(-7.0)


def nbytes(sd) -> int:
    return sum(box(t)[0].numel() * box(t)[0].element_size() for _, t in leaves(sd))


def describe(hidden: int, layers: int) -> str:
    vocab = VOCAB_PER_HIDDEN * hidden
    return (f"{layers} layers, hidden {hidden}, vocabulary {vocab} "
            f"(bf16 attention/MLP weights, fp32 embedding/head/norms) + AdamW")


def state_bytes(hidden: int, layers: int) -> int:
    per_layer = 12 * hidden * hidden * 2 * 3 + 4 * hidden * 4 * 3 + 4 * 4
    emb = 2 * VOCAB_PER_HIDDEN * hidden * hidden * 4 * 3 + 2 * 4
    norm = 2 * hidden * 4 * 3 + 2 * 4
    return layers * per_layer + emb + norm


def fmt_gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"

