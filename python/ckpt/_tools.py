"""Console entry points for ckpt's command-line tools (pyproject.toml's
[project.scripts]): `ckpt-inspect`, `ckpt-validate`, `ckpt-diff`,
`ckpt-reshard`, `ckpt-convert` and `ckpt-synth` on PATH after
`pip install .`. Each replaces the Python process with the C++ tool that the
wheel carries in ckpt/bin/, so arguments, output and exit codes are the
tool's own (tools/README.md)."""
import os
import sys

_BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")


def _exec(name: str) -> None:
    path = os.path.join(_BIN, name)
    if not os.access(path, os.X_OK):
        sys.stderr.write(f"{name}: error: {path} is missing: this ckpt package was not "
                         "installed from a wheel (`pip install .`); the tools of a "
                         "CMake build are in build/bin/\n")
        sys.exit(2)
    sys.stdout.flush()
    os.execv(path, [name] + sys.argv[1:])


def inspect() -> None:
    _exec("ckpt-inspect")


def validate() -> None:
    _exec("ckpt-validate")


def diff() -> None:
    _exec("ckpt-diff")


def reshard() -> None:
    _exec("ckpt-reshard")


def convert() -> None:
    _exec("ckpt-convert")


def synth() -> None:
    _exec("ckpt-synth")
