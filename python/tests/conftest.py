"""Shared by the Python tests (label `python`, run by ctest with
PYTHONPATH=build/python). torch and mpi4py are optional outside CI: a test
module that needs one is skipped without it; in CI (CI=true) it fails."""
import importlib
import os

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
