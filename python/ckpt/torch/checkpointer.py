"""Checkpointer: the checkpoints of one training run, with the ckpt Writer
(its staging memory and save plan cache) owned by an object instead of by
module-level state.

    ckpt_ = ckpt.torch.Checkpointer("/ckpt/run1", keep_last=3)
    ckpt_.load({"model": model, "optim": optim})          # resumes, if any
    for step in ...:
        ...
        handle = ckpt_.save_async({"model": model, "optim": optim}, step)
    ckpt_.close()                                          # or `with`

Every rank of the group makes one with the same arguments and calls its
methods together, as with the functional ckpt.torch.save / load (which
remain, as conveniences that keep one Writer per process group until
ckpt.torch.release()).
"""
import os
from typing import Callable, Dict, List, Optional

from .. import _ckpt
from .._errors import FailedPreconditionError
from ._comm import _communicator
from ._load import load as _load
from ._save import (SaveHandle, _await_in_flight, _fits, _new_writer, _plan_save,
                    _snapshot_sizes)



class Checkpointer:
    """Saves and loads the checkpoints of one run under `root`.

    process_group: a torch.distributed group (None: the default group when
    torch.distributed is initialised with several ranks, else a single
    process) or any ckpt communicator. save_options (codec, zstd_level,
    keep_last, io_threads, overwrite, metadata, ...; ckpt.SaveOptions's
    fields) apply to every save; a save's own keyword arguments override
    them. verify_replicas=True compares the copies of replicated tensors
    at every save.

    The Writer is made at the first save and reused: the pinned staging
    memory of save_async and the save plan (replanned whenever any rank's
    structure changes) live as long as the Checkpointer. At most one save
    is in flight: a save waits for the previous save_async first. close()
    waits for it and frees the Writer; the Checkpointer is then unusable.
    Not thread-safe: call it from the training loop's thread.
    """

    def __init__(self, root: str, *, process_group=None, verify_replicas: bool = False,
                 **save_options):
        self.root = os.fspath(root)
        self._group = process_group
        self._verify_replicas = verify_replicas
        self._save_options = save_options
        self._comm = None
        self._writer = None
        self._in_flight: Optional[SaveHandle] = None
        self._closed = False

    # -- saving --------------------------------------------------------------

    def save(self, state_dict: Dict, step: int, **options) -> _ckpt.SaveResult:
        """Saves `state_dict` as checkpoint `step` (atomically; `latest` then
        names it) and returns the SaveResult, the same on every rank. As
        ckpt.torch.save, with this Checkpointer's Writer and options."""
        plan = self._plan(state_dict, step, options, for_async=False)
        return plan.writer.save(plan.root, plan.step, plan.options)

    def save_async(self, state_dict: Dict, step: int, **options) -> SaveHandle:
        """As save, but returns a SaveHandle once `state_dict` is snapshotted
        into staging memory: the trainer may modify its tensors at once.
        handle.wait() (or the next save, or close()) returns the SaveResult
        once the checkpoint is durable, or raises the background's error."""
        plan = self._plan(state_dict, step, options, for_async=True)
        self._in_flight = SaveHandle(plan.writer.save_async(plan.root, plan.step, plan.options))
        return self._in_flight

    def _plan(self, state_dict: Dict, step: int, options: Dict, for_async: bool):
        self._check_open()
        self._wait_in_flight()
        _await_in_flight(self._group)  # a functional save_async of the same group
        if self._writer is None:
            self._comm = _communicator(self._group)
        merged = dict(self._save_options)
        merged.update(options)
        to_device = bool(merged.get("snapshot_to_device"))

        def writer_for(leaves):
            # save_async: staging for the whole state (and device snapshot
            # memory), as ckpt.torch.save_async; a new Writer when it grows.
            staging, device = _snapshot_sizes(leaves, to_device) if for_async else (0, 0)
            if self._writer is None or not _fits(self._writer, device, staging):
                self._writer = None  # the old one's memory is freed first
                self._writer = _new_writer(self._comm, device, staging)
            return self._writer  # what the last save registered the same way stays
        return _plan_save(writer_for, state_dict, self.root, int(step), self._comm,
                          self._verify_replicas, merged)

    def _wait_in_flight(self) -> None:
        """Waits for the save_async in flight; its error is raised by its own
        handle's wait(), which the caller holds, so it is not raised again
        here (the next save must still run)."""
        previous, self._in_flight = self._in_flight, None
        if previous is not None:
            try:
                previous.wait()
            except Exception:  # noqa: BLE001 - reported by the handle's own wait()
                pass

    # -- loading -------------------------------------------------------------

    def load(self, state_dict: Dict, *, step: Optional[int] = None, strict: bool = True,
             filter: Optional[Callable[[str], bool]] = None,
             on_complete: Optional[Callable[[str], None]] = None) -> _ckpt.LoadReport:
        """Loads checkpoint `step` (default: `latest`) into `state_dict` in
        place, from any saved layout and world size; as ckpt.torch.load
        (strict, filter and on_complete mean the same). A save_async in
        flight is waited for first, so a load never sees a half-written
        step."""
        self._check_open()
        self._wait_in_flight()
        return _load(state_dict, self.root, step=step, process_group=self._group,
                     strict=strict, filter=filter, on_complete=on_complete)

    def steps(self) -> List[int]:
        """The steps of the committed checkpoints under root, ascending (a
        step directory without its manifest is not committed and not
        listed). [] when root does not exist. Local paths and s3:// URLs
        alike, through the package's storage."""
        try:
            return list(_ckpt._committed_steps(self.root))
        except FileNotFoundError:
            return []

    def latest_step(self) -> Optional[int]:
        """The step `latest` names, or None when root holds no checkpoint."""
        try:
            return _ckpt.Reader(self.root).step
        except FileNotFoundError:
            return None

    # -- lifetime ------------------------------------------------------------

    def close(self) -> None:
        """Waits for the save in flight (its outcome is its handle's) and
        frees the Writer and its staging memory. Idempotent."""
        if self._closed:
            return
        self._wait_in_flight()
        self._writer = None
        self._comm = None
        self._closed = True

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise FailedPreconditionError(f"Checkpointer({self.root!r}) is closed")

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"Checkpointer({self.root!r}, {state})"
