"""The Stateful protocol: a value with state_dict() and load_state_dict()
(a module, an optimizer, an LR scheduler, a user object) is saved as its
state dict, flattened under its name, and restored by loading its state
dict in place and then handing it back to the object.

  * torch.nn.Module: torch.distributed.checkpoint.state_dict's
    get_model_state_dict / set_model_state_dict (FQN keys: no DDP
    "module." or torch.compile prefixes; FSDP2 and tensor-parallel
    parameters as DTensors);
  * torch.optim.Optimizer: get_optimizer_state_dict /
    set_optimizer_state_dict with the module of the same state dict whose
    parameters it optimizes ({"state": {fqn: {...}}, "param_groups": [...]},
    DTensor-valued under FSDP2 and TP; state not made yet is created by a
    step at lr 0); a ZeroRedundancyOptimizer as
    ckpt.torch.optimizer_state_dict (each rank its own partition);
  * anything else: obj.state_dict() / obj.load_state_dict(state).
A module and the one optimizer of the same state dict that updates it,
each there once, go through get_state_dict / set_state_dict together (the
same state dicts; DCP's API checks the module's parameter names once per
call, so one call costs about half of two): their state is got when the
first of the two is met, and restored when the second is.
Where torch has no torch.distributed.checkpoint, modules use
state_dict() / load_state_dict().
"""
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .._errors import InvalidArgumentError, UnknownError


def is_stateful(value) -> bool:
    """Whether `value` follows the protocol (tensors and dicts never do)."""
    return (not isinstance(value, (dict, torch.Tensor))
            and callable(getattr(value, "state_dict", None))
            and callable(getattr(value, "load_state_dict", None)))


@dataclass
class Stateful:
    """One stateful value of a state dict: its entry name, the object, and
    holder[key], the state dict it was saved as (a load fills it in
    place; restore() hands it to the object)."""
    name: str
    obj: Any
    holder: Dict[str, Any]
    key: str
    restore_fn: Callable[[Any], None]
    # What a failure of restore_fn names: "entry 'optim': ... into the
    # AdamW" (the entries and types of both values of a pair).
    entries: str = ""
    types: str = ""

    def restore(self) -> None:
        """Hands the loaded state to the object. UnknownError naming the
        entry when its load_state_dict (or set_*_state_dict) raises."""
        try:
            self.restore_fn(self.holder[self.key])
        except Exception as e:  # named for every rank
            entries = self.entries or f"entry '{self.name}'"
            types = self.types or type(self.obj).__name__
            raise UnknownError(f"{entries}: restoring the loaded state into the {types} "
                               f"raised {type(e).__name__}: {e}") from e


def _dsd():
    """torch.distributed.checkpoint.state_dict, or None."""
    try:
        from torch.distributed.checkpoint import state_dict
        return state_dict
    except ImportError:  # torch without distributed
        return None


def _modules_and_optimizers(state: Dict):
    """The modules and the optimizers among the values of `state`, nested
    dicts included, in order, each as often as it is met (each dict once: a
    dict that contains itself ends the walk, not the stack)."""
    modules, optimizers, seen, stack = [], [], {id(state)}, [iter(state.values())]
    while stack:
        v = next(stack[-1], stack)
        if v is stack:
            stack.pop()
        elif isinstance(v, torch.nn.Module):
            modules.append(v)
        elif isinstance(v, torch.optim.Optimizer):
            optimizers.append(v)
        elif isinstance(v, dict) and id(v) not in seen:
            seen.add(id(v))
            stack.append(iter(v.values()))
    return modules, optimizers


def _holders(optimizer, modules: List[torch.nn.Module]) -> List[torch.nn.Module]:
    """The modules whose parameters include every parameter `optimizer`
    updates, in order."""
    params = {id(p) for g in optimizer.param_groups for p in g["params"]}
    return [m for m in modules if params <= {id(p) for p in m.parameters()}]


def _model_of(name: str, optimizer, modules: List[torch.nn.Module]) -> torch.nn.Module:
    """The first module whose parameters include every parameter
    `optimizer` updates. InvalidArgumentError naming the entry when there is
    none."""
    holders = _holders(optimizer, modules)
    if holders:
        return holders[0]
    raise InvalidArgumentError(
        f"entry '{name}': an optimizer is saved by parameter names, from the module whose "
        "parameters it updates: put that module in the same state dict (e.g. "
        "{'model': model, 'optim': optimizer})")


def _handlers(name: str, obj, modules: Callable[[], List[torch.nn.Module]]):
    """(state dict getter, restorer) of a stateful object."""
    dsd = _dsd()
    if isinstance(obj, torch.nn.Module) and dsd is not None:
        return (lambda: dsd.get_model_state_dict(obj),
                lambda sd: dsd.set_model_state_dict(obj, sd))
    if isinstance(obj, torch.optim.Optimizer):
        model = _model_of(name, obj, modules())
        from ._optim import is_zero_redundancy
        if is_zero_redundancy(obj) or dsd is None:
            from ._optim import optimizer_state_dict, set_optimizer_state_dict
            return (lambda: optimizer_state_dict(model, obj),
                    lambda sd: set_optimizer_state_dict(model, obj, sd))
        from ._optim import _init_state

        def get():
            _init_state(obj)  # before torch's own, which would leave step = 1
            return dsd.get_optimizer_state_dict(model, obj)
        return (get, lambda sd: dsd.set_optimizer_state_dict(model, obj, sd))
    return obj.state_dict, obj.load_state_dict


class _Pair:
    """A module and the optimizer that updates it, got and restored through
    one get_state_dict / set_state_dict. Half 0 is the module's, 1 the
    optimizer's: get(h) hands out half h of the pair's state (both got at
    the first call), restore(h, sd) keeps it until both halves are back,
    then sets both."""

    def __init__(self, dsd, model: torch.nn.Module, optim: torch.optim.Optimizer):
        self._dsd, self.objs = dsd, (model, optim)
        self._got: List[Any] = []
        self._back: Dict[int, Any] = {}
        self.met: List[Tuple[str, int]] = []  # (entry, half), in the order met

    def get(self, half: int):
        if not self._got:
            from ._optim import _init_state
            _init_state(self.objs[1])  # before torch's own, which would leave step = 1
            self._got = list(self._dsd.get_state_dict(*self.objs))
        return self._got[half]

    def restore(self, half: int, sd) -> None:
        self._back[half] = sd
        if len(self._back) == 2:
            back, self._back = self._back, {}
            self._dsd.set_state_dict(*self.objs, model_state_dict=back[0],
                                     optim_state_dict=back[1])


def _pairs(dsd, modules: List[torch.nn.Module],
           optimizers: List[torch.optim.Optimizer]) -> Dict[int, tuple]:
    """id(value) -> (its _Pair, its half) for every module and optimizer of
    a state dict (_modules_and_optimizers) that pair: an optimizer (not
    ZeroRedundancyOptimizer) that updates parameters of one module only,
    the two each met once in the walk, and no other optimizer of that
    module."""
    if dsd is None:
        return {}
    from ._optim import is_zero_redundancy
    count: Dict[int, int] = {}
    for v in modules + optimizers:
        count[id(v)] = count.get(id(v), 0) + 1
    owner: Dict[int, List[torch.optim.Optimizer]] = {}
    for opt in optimizers:
        if count[id(opt)] != 1 or is_zero_redundancy(opt):
            continue
        holders = _holders(opt, modules)
        if len(holders) == 1 and count[id(holders[0])] == 1:
            owner.setdefault(id(holders[0]), []).append(opt)
    out = {}
    for m in modules:
        opts = owner.get(id(m), [])
        if len(opts) == 1:
            pair = _Pair(dsd, m, opts[0])
            out[id(m)], out[id(opts[0])] = (pair, 0), (pair, 1)
    return out


class Statefuls:
    """The stateful values met while flattening one state dict: expand is
    _flatten's hook, found lists them in order."""

    def __init__(self, state: Dict):
        self._state = state
        self._walked: Optional[tuple] = None  # _modules_and_optimizers(state)
        self._pairs: Optional[Dict[int, tuple]] = None
        self.found: List[Stateful] = []

    def _walk(self) -> tuple:
        if self._walked is None:
            self._walked = _modules_and_optimizers(self._state)
        return self._walked

    def _all_modules(self) -> List[torch.nn.Module]:
        return self._walk()[0]

    def _handlers(self, name: str, value):
        """(getter, restorer, entries, types) of a stateful value: those of
        its pair's half, else _handlers'."""
        if self._pairs is None and isinstance(value, (torch.nn.Module, torch.optim.Optimizer)):
            self._pairs = _pairs(_dsd(), *self._walk())
        paired = (self._pairs or {}).get(id(value))
        if paired is None:
            return _handlers(name, value, self._all_modules) + ("", "")
        pair, half = paired
        pair.met.append((name, half))
        entries = types = ""
        if len(pair.met) == 2:  # its restore sets both
            entries = " and ".join(f"'{n}'" for n, _ in pair.met)
            entries = f"entries {entries}"
            types = " and the ".join(type(pair.objs[h]).__name__ for _, h in pair.met)
        return (lambda: pair.get(half), lambda sd: pair.restore(half, sd), entries, types)

    def expand(self, name: str, key: str, value) -> Optional[Dict[str, Any]]:
        """{key: value's state dict} for a stateful value (entry `name`,
        `key` in its dict), else None. UnknownError naming the entry when
        its state_dict() raises."""
        if not is_stateful(value):
            return None
        get, restore, entries, types = self._handlers(name, value)
        try:
            sd = get()
        except Exception as e:  # reported to every rank by the caller
            raise UnknownError(f"entry '{name}': {type(value).__name__}.state_dict() raised "
                               f"{type(e).__name__}: {e}") from e
        holder = {key: sd}
        self.found.append(Stateful(name, value, holder, key, restore, entries, types))
        return holder
