# Shared by scripts/*: sourced, not run. The caller has done
# `set -euo pipefail` and `cd` to the repository root.

# ckpt_build DIR [CMAKE_ARG...]
# Configures DIR with Ninja (only when DIR/build.ninja is missing, so the
# CMAKE_ARGs apply to a fresh tree only) and builds it with -j2. Prints one
# line, "build: up to date (DIR/)" or "build: N steps in Ss (DIR/)", plus any
# compiler warnings; on failure prints the errors and returns non-zero.
ckpt_build() {
  local dir=$1
  shift
  if [[ ! -f $dir/build.ninja ]]; then
    mkdir -p "$dir"
    echo "configure: $dir $*"
    if ! cmake -S . -B "$dir" -G Ninja "$@" >"$dir/ckpt-configure.log" 2>&1; then
      cat "$dir/ckpt-configure.log" >&2
      echo "configure: FAILED ($dir; log in $dir/ckpt-configure.log)" >&2
      return 1
    fi
    grep -E '^-- ckpt:|^CMake Warning' "$dir/ckpt-configure.log" || true
  fi

  # Ninja's "[3/57] Building ..." progress lines and CMake's re-configure
  # chatter are dropped (the re-check of globbed sources, python/'s
  # CONFIGURE_DEPENDS, is no build step); everything else (warnings,
  # errors) goes through.
  local start=$SECONDS rc=0 steps
  cmake --build "$dir" -j2 2>&1 | awk -v count="$dir/ckpt-build-steps" '
    /Re-checking globbed directories/ { next }
    /^\[[0-9]+\/[0-9]+\] / { steps++; next }
    /^ninja: no work to do\.$/ || /^-- / { next }
    { print; fflush() }
    END { print steps + 0 > count }
  ' || rc=$?
  if ((rc != 0)); then
    echo "build: FAILED ($dir)" >&2
    return "$rc"
  fi
  steps=$(cat "$dir/ckpt-build-steps" 2>/dev/null || echo 0)
  if ((steps == 0)); then
    echo "build: up to date ($dir/)"
  else
    echo "build: $steps steps in $((SECONDS - start))s ($dir/)"
  fi
}

# ckpt_werror_flag: the CMake flag for CKPT_WERROR: ON when CI=true (CI
# builds fail on any compiler warning), else OFF.
ckpt_werror_flag() {
  if [[ ${CI:-} == true ]]; then
    echo -DCKPT_WERROR=ON
  else
    echo -DCKPT_WERROR=OFF
  fi
}

# ckpt_ccache_flag: -DCKPT_CCACHE=ON when ccache is installed, else OFF
# (CMakeLists.txt says what it shares between build trees).
ckpt_ccache_flag() {
  if command -v ccache >/dev/null 2>&1; then
    echo -DCKPT_CCACHE=ON
  else
    echo -DCKPT_CCACHE=OFF
  fi
}

# Environment for running the test suite on a small CI box or a container:
# Open MPI refuses to start as root and to run more ranks than cores (the
# MPI tests may use more ranks than a 2-core machine has cores), and its shared-memory
# single-copy path (CMA) is often forbidden in containers. Values already set
# by the caller win.
ckpt_test_env() {
  if [[ $(id -u) == 0 ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
    export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
  fi
  export OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe:-1}
  export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
}

# ckpt_venv: makes .venv/ (once) from the machine's CPython 3.11 (the
# interpreter the torch 2.13.0 wheel on disk is built for: `python3.11` on
# PATH, else `python3` when it is 3.11) and installs requirements.txt into
# it whenever that file changed since the last install (its sha256 is kept
# in .venv/ckpt-requirements.sha256). Prints one line. CMake builds the
# Python package for .venv/bin/python (CMakeLists.txt).
ckpt_venv() {
  local want have py
  want=$(sha256sum requirements.txt | cut -d' ' -f1)
  have=$(cat .venv/ckpt-requirements.sha256 2>/dev/null || true)
  if [[ -x .venv/bin/python && $want == "$have" ]]; then
    echo "venv: up to date (.venv/, $(.venv/bin/python --version))"
    return 0
  fi
  if [[ ! -x .venv/bin/python ]]; then
    py=$(command -v python3.11 || true)
    if [[ -z $py ]] && python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      py=$(command -v python3)
    fi
    if [[ -z $py ]]; then
      echo "venv: no CPython 3.11 on PATH (python3.11); the torch 2.13.0 CPU wheel needs it" >&2
      return 1
    fi
    "$py" -m venv .venv
  fi
  local start=$SECONDS
  # pip's own chatter is dropped; its errors (and a failed exit) go through.
  # The bytecode is compiled afterwards, on every core: pip compiles one file
  # at a time (about 45 of its 79 s in CI). It must be compiled: the Python
  # tests run with PYTHONDONTWRITEBYTECODE=1, so every process they start
  # would otherwise compile torch's modules from source (python.training
  # 35 s -> 81 s). compileall's failures (files of packages that are not
  # Python 3.11 source, which pip skips too) only go to the log.
  if ! .venv/bin/pip install --disable-pip-version-check --no-compile -q \
       -r requirements.txt > .venv/ckpt-pip.log 2>&1; then
    grep -v '^WARNING: Location' .venv/ckpt-pip.log >&2
    echo "venv: pip install -r requirements.txt FAILED (log in .venv/ckpt-pip.log)" >&2
    return 1
  fi
  .venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c \
    'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    >> .venv/ckpt-pip.log 2>&1 || true
  echo "$want" > .venv/ckpt-requirements.sha256
  echo "venv: installed requirements.txt in $((SECONDS - start))s (.venv/, $(.venv/bin/python --version))"
}
