"""Shared by the Python tests (label `python`, run by ctest with
PYTHONPATH=build/python). torch and mpi4py are optional outside CI: a test
module that needs one is skipped without it; in CI (CI=true) it fails."""
import importlib
import os
import threading

import pytest


def require(module: str):
    """Imports `module`, or skips the calling test module (fails in CI)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"{module} is not installed", allow_module_level=True)


def tool(name: str) -> str:
    """Path of a C++ tool (ckpt-validate, ...) of this build."""
    path = os.path.join(os.environ.get("CKPT_BIN_DIR", "build/bin"), name)
    assert os.access(path, os.X_OK), f"{path} is not built"
    return path


class ThreadRanks:
    """A Python communicator: `size` ranks as threads of this process."""

    def __init__(self, rank: int, shared: dict):
        self.rank, self.size, self.shared = rank, shared["size"], shared

    def _exchange(self, value):
        s = self.shared
        s["barrier"].wait()
        s["slots"][self.rank] = value
        s["barrier"].wait()
        out = list(s["slots"])
        s["barrier"].wait()
        return out

    def all_gather(self, data):
        return self._exchange(data)

    def broadcast(self, data, root):
        return self._exchange(data)[root]

    def barrier(self):
        self._exchange(None)

    def all_reduce_max(self, values):
        return [max(col) for col in zip(*self._exchange(list(values)))]



def run_ranks(size: int, fn, timeout: float = 120):
    """Runs fn(comm) on `size` threads, each with its ThreadRanks; returns
    the results in rank order, or the exceptions (one per rank) when any
    rank raised."""
    shared = {"size": size, "barrier": threading.Barrier(size), "slots": [None] * size}
    results, errors = [None] * size, [None] * size

    def body(r):
        try:
            results[r] = fn(ThreadRanks(r, shared))
        except BaseException as e:  # handed to the caller
            errors[r] = e
    # Daemons: a hung rank fails the test instead of blocking the exit.
    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a rank hung"
    if any(e is not None for e in errors):
        raise RanksFailed(errors)
    return results


class RanksFailed(Exception):
    def __init__(self, errors):
        super().__init__("; ".join(f"rank {r}: {type(e).__name__}: {e}"
                                   for r, e in enumerate(errors) if e is not None))
        self.errors = errors
