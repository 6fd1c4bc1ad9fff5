"""`pip install .` builds ckpt (pyproject.toml, scikit-build-core): the
wheel holds the extension, the `ckpt` package and the command-line tools
as console entry points. Installed into a fresh virtual environment (torch
2.13.0 from the wheel on disk), it imports with the C++ library's version,
saves and loads on 2 ranks under torchrun, and its `ckpt-validate` and
`ckpt-inspect` on PATH check what it wrote.

ctest runs it as python.wheel. CKPT_WHEEL_BUILD_DIR keeps the wheel's CMake
build between runs (ctest sets it beside the build tree). Without ccache it
is slow (it compiles the library and the tools once more: minutes on two
cores); with it, ctest also sets CKPT_WHEEL_BUILD_TYPE and
CKPT_WHEEL_CMAKE_DEFINES ("KEY=VALUE|KEY=VALUE": the build tree's compiler
and flags) so that ccache serves the build tree's objects
(python/tests/CMakeLists.txt)."""
import os
import subprocess
import sys
import sysconfig

import pytest

from conftest import require

require("scikit_build_core")
require("pybind11")

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = ["ckpt-inspect", "ckpt-validate", "ckpt-diff", "ckpt-reshard", "ckpt-convert",
         "ckpt-synth"]


def run(cmd, **kw):
    """Runs cmd; on failure the assertion shows its output."""
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert p.returncode == 0, (f"{' '.join(map(str, cmd))} exited {p.returncode}\n"
                               f"stdout:\n{p.stdout[-4000:]}\nstderr:\n{p.stderr[-4000:]}")
    return p


def clean_env(**extra):
    """The environment of a user's shell: no PYTHONPATH into build/python."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "CKPT_BIN_DIR", "VIRTUAL_ENV")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    build_dir = os.environ.get("CKPT_WHEEL_BUILD_DIR", str(out / "build"))
    settings = [f"build-dir={build_dir}"]
    if os.environ.get("CKPT_WHEEL_BUILD_TYPE"):
        settings.append(f"cmake.build-type={os.environ['CKPT_WHEEL_BUILD_TYPE']}")
    for define in filter(None, os.environ.get("CKPT_WHEEL_CMAKE_DEFINES", "").split("|")):
        settings.append(f"cmake.define.{define}")
    run([sys.executable, "-m", "pip", "wheel", SRC, "--no-build-isolation", "--no-deps",
         "--disable-pip-version-check", "-q", "-w", str(out)]
        + [f"--config-settings={s}" for s in settings],
        env=clean_env(CMAKE_BUILD_PARALLEL_LEVEL="2"))
    wheels = [f for f in os.listdir(out) if f.endswith(".whl")]
    assert len(wheels) == 1, wheels
    return out / wheels[0]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A fresh virtual environment with torch 2.13.0 and the wheel.
    --no-compile: pip would byte-compile every module of torch and its
    dependencies one file at a time (half of this fixture's ~50 s); the
    modules the test imports are compiled, and their bytecode written into
    the environment, by the first process that imports them (torchrun's
    agent, before it starts the ranks: venv_env() lets it write)."""
    env_dir = tmp_path_factory.mktemp("venv")
    base = getattr(sys, "_base_executable", sys.executable)
    run([base, "-m", "venv", str(env_dir)], env=clean_env())
    run([str(env_dir / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
         "--no-compile", "torch==2.13.0", str(wheel)], env=clean_env())
    return env_dir


def venv_env(venv):
    """A user's shell with the environment's bin/ first on PATH; Python may
    write bytecode (ctest's PYTHONDONTWRITEBYTECODE keeps the source tree
    clean; the environment is this test's own)."""
    env = clean_env(PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                    OMP_NUM_THREADS="1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def test_wheel_holds_the_package_the_extension_and_the_tools(wheel):
    import zipfile
    names = zipfile.ZipFile(wheel).namelist()
    ext = sysconfig.get_config_var("EXT_SUFFIX")
    for f in ["ckpt/__init__.py", "ckpt/torch/__init__.py", "ckpt/values.py", "ckpt/_tools.py",
              f"ckpt/_ckpt{ext}"] + [f"ckpt/bin/{t}" for t in TOOLS]:
        assert f in names, f"{wheel.name} lacks {f}"
    # Nothing but the package: no static libraries, headers or CMake files.
    assert all(n.startswith(("ckpt/", "ckpt-")) for n in names), sorted(
        n for n in names if not n.startswith(("ckpt/", "ckpt-")))
    entry_points = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    for t in TOOLS:
        assert f"{t} = ckpt._tools:" in entry_points, entry_points


def test_installed_wheel_saves_loads_and_validates(venv, tmp_path):
    bin_dir = venv / "bin"
    env = venv_env(venv)
    root = tmp_path / "run"
    p = run([str(bin_dir / "torchrun"), "--standalone", "--nproc-per-node", "2",
             os.path.join(os.path.dirname(__file__), "wheel_smoke.py"), str(root)],
            env=env, cwd=tmp_path)
    assert "2-rank save, resharded load: ok" in p.stdout, p.stdout

    # The tools from PATH (console entry points), not from a build tree.
    v = run(["ckpt-validate", str(root)], env=env, cwd=tmp_path)
    assert "VALID: no problems found" in v.stdout, v.stdout
    i = run(["ckpt-inspect", str(root)], env=env, cwd=tmp_path)
    assert "World size     2" in i.stdout, i.stdout
    version = run([str(bin_dir / "python"), "-c", "import ckpt; print(ckpt.__version__)"],
                  env=env, cwd=tmp_path).stdout.strip()
    for t in TOOLS:
        out = run([t, "--version"], env=env, cwd=tmp_path).stdout
        assert version in out, (t, out, version)
    bad = subprocess.run(["ckpt-validate", str(tmp_path / "nothing")], env=env,
                         capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2, (bad.returncode, bad.stderr)
