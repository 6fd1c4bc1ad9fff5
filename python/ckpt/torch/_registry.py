"""What a kept Writer holds from its last save, so that the next save of
the same state registers only what changed.

A trainer saves the same tensors at every checkpoint: the same memory,
shapes and layouts, though state_dict() returns new (detached) tensor
objects each time. Checking and registering each of them again costs
10-20 us per tensor in Python (its properties, DLPack, the Writer's own
checks): 30 ms of a 1,744-tensor save_async's blocked time on an H100
host. A tensor whose signature (below) equals the one registered under its
name by the last save is left registered: the Writer's registration (its
pointer, dtype, shape, region, memory, replica flag) would be the same.

The signature of a tensor holds everything a registration is made from
and everything the checks that admitted it looked at: the tensor's class,
dtype, device, shape, strides, address, negative and conjugate bits, and
for a DTensor also its global shape, placements and mesh (kept alive, so
that its id is not reused). A registration is kept only for a save whose
tensor under that name has the same signature, so the Writer copies from
exactly the memory that registering that tensor would give it, memory the
tensor keeps alive while the save reads it (until save returns; until
save_async returns, which snapshots every tensor before it does). A
tensor set to other memory (`set_`, `.data =`, a new tensor) has another
address and is registered again. Values copied per save (a
non-contiguous DTensor local, a redistributed DTensor, a Chunk) have no
signature and are registered every time."""
from typing import Any, Callable, Dict, Optional, Set

import torch

from .dtensor import dtensor_class


# A Python value's entry in begin()'s signatures (set every save).
VALUE = object()

# The most entries a save removes one by one (begin()).
_MOST_REMOVALS = 64


class Registrations:
    """The names a Writer holds and how each got there. One save at a time:
    begin(), then tensor() or value() for each entry this rank registers,
    then end(); the Writer's clear() (reset()) whenever a save fails part
    way."""

    def __init__(self):
        self._tensors: Dict[str, Optional[tuple]] = {}  # name -> signature
        self._values: Set[str] = set()
        self._seen: Set[str] = set()

    def begin(self, writer, sigs: Dict[str, Any]) -> None:
        """Starts a save whose entries are the keys of `sigs` (entry name ->
        signature, None, or VALUE): what the last save registered under
        other names goes now. When many entries are to be registered
        again (new memory, no signature) the Writer is cleared instead and
        every entry registered anew: Writer.remove is linear in the
        entries, so removing them one by one would be quadratic."""
        stale = [n for n in self._tensors if n not in sigs]
        stale += [n for n in self._values if n not in sigs]
        again = sum(1 for n, sig in sigs.items()
                    if sig is not VALUE and n in self._tensors
                    and (sig is None or self._tensors[n] != sig))
        if len(stale) + again > _MOST_REMOVALS:
            writer.clear()
            self.reset()
        else:
            for name in stale:
                self._drop(writer, name)
        self._seen = set()

    def kept(self, name: str, sig: Optional[tuple]) -> bool:
        """Whether `name` stays registered as the last save left it (same
        signature); marks it as part of this save either way."""
        self._seen.add(name)
        return sig is not None and self._tensors.get(name) == sig

    def tensor(self, writer, name: str, sig: Optional[tuple], add: Callable[[], Any]) -> bool:
        """Registers tensor `name` with add() unless kept(name, sig).
        Returns whether `name` is registered now: kept, or add() did not
        return False (a DTensor registered later, _register_deferred)."""
        if self.kept(name, sig):
            return True
        self._drop(writer, name)
        if add() is False:
            return False
        self._tensors[name] = sig
        return True

    def value(self, writer, name: str, data: bytes) -> None:
        """Sets object `name` (replacing the last save's bytes)."""
        self._seen.add(name)
        if name in self._tensors:
            self._drop(writer, name)
        writer.set_object(name, data)
        self._values.add(name)

    def end(self, writer) -> None:
        """Removes what the last save registered and this one did not: a
        value another rank sets now (the lowest rank that holds a value
        sets it), a name no longer in the state (begin())."""
        stale = [n for n in self._tensors if n not in self._seen]
        stale += [n for n in self._values if n not in self._seen]
        for name in stale:
            self._drop(writer, name)

    def reset(self) -> None:
        self._tensors.clear()
        self._values.clear()

    def _drop(self, writer, name: str) -> None:
        if name in self._tensors or name in self._values:
            writer.remove(name)
            self._tensors.pop(name, None)
            self._values.discard(name)


def tensor_signature(t: torch.Tensor, *extra) -> Optional[tuple]:
    """The signature of a plain tensor registered as it is (module
    docstring), with `extra` (how it is registered); None where it has
    none."""
    try:
        if t.layout is not torch.strided:
            return None
        return (type(t), t.dtype, t.device, t.shape, t.stride(), t.data_ptr(), t.is_neg(),
                t.is_conj(), *extra)
    except RuntimeError:  # no storage (a functorch wrapper, a fake tensor)
        return None


def dtensor_signature(v) -> Optional[tuple]:
    """The signature of a DTensor whose contiguous local tensor is
    registered as it is; None for other distributed values."""
    dt = dtensor_class()
    if dt is None or type(v) is not dt:
        return None
    local = getattr(v, "_local_tensor", None)
    if local is None or not local.is_contiguous():
        return None
    sig = tensor_signature(local)
    if sig is None:
        return None
    return ("dtensor", sig, v.shape, tuple(v.placements), v.device_mesh)
