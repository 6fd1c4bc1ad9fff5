"""Optimizer state keyed by parameter names (DDP, ZeroRedundancyOptimizer).

For FSDP2 and tensor parallelism pass the optimizer itself in the state
dict, next to its model ({"model": model, "optim": optimizer}): it is
saved through torch.distributed.checkpoint.state_dict's
get_optimizer_state_dict (FQN keys, DTensor values) and restored through
set_optimizer_state_dict (ckpt.torch._stateful); a ZeroRedundancyOptimizer
passed that way uses optimizer_state_dict below."""
import sys
from typing import Any, Dict

import torch


def is_zero_redundancy(optimizer) -> bool:
    """Whether `optimizer` is a ZeroRedundancyOptimizer. Its class is looked
    up among the imported modules, never imported here: an instance exists
    only once its module was imported, and importing
    torch.distributed.optim compiles its functional optimizers with
    TorchScript (about 3 s, once per process, on a 2-core machine), which
    would land inside the first save."""
    mod = sys.modules.get("torch.distributed.optim.zero_redundancy_optimizer")
    return mod is not None and isinstance(optimizer, mod.ZeroRedundancyOptimizer)


def _local_optimizer(optimizer):
    """The optimizer whose state this rank holds: a ZeroRedundancyOptimizer's
    partition (optimizer.optim), or the optimizer itself."""
    return optimizer.optim if is_zero_redundancy(optimizer) else optimizer


def _init_state(opt) -> None:
    """Creates an optimizer's lazily made state, so that a save has its
    tensors and a load has tensors to fill, as the optimizer's first step
    would find it: one step at lr 0 with zero gradients makes the entries,
    then every state tensor is zeroed and every step count set to 0.

    Unlike torch's own initialisation (torch.distributed.checkpoint's
    _init_optim_state, which leaves step = 1 and, with real gradients
    present, moments of those gradients), saving before the first step
    leaves the training that follows bit for bit as without the save:
    parameters and gradients are restored, and the first real step starts
    from step 0 and zero moments (exact for SGD without dampening, Adam,
    AdamW). Does nothing when the state exists."""
    if opt.state:
        return
    params = [p for g in opt.param_groups for p in g["params"] if p.requires_grad]
    grads = [p.grad for p in params]
    lrs = [g.get("lr") for g in opt.param_groups]
    for p in params:
        p.grad = torch.zeros_like(p)
    for g in opt.param_groups:
        if "lr" in g:
            g["lr"] = torch.tensor(0.0) if isinstance(g["lr"], torch.Tensor) else 0.0
    try:
        opt.step()
    finally:
        for g, lr in zip(opt.param_groups, lrs):
            if lr is not None:
                g["lr"] = lr
        for p, grad in zip(params, grads):
            p.grad = grad
    _zero_state(opt)


def _zero_state(opt) -> None:
    """Every state tensor zeroed and every plain-number step count 0."""
    with torch.no_grad():
        for st in opt.state.values():
            for key, value in st.items():
                if isinstance(value, torch.Tensor):
                    value.zero_()
                elif key == "step":
                    st[key] = 0


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
