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
  # chatter are dropped; everything else (warnings, errors) goes through.
  local start=$SECONDS rc=0 steps
  cmake --build "$dir" -j2 2>&1 | awk -v count="$dir/ckpt-build-steps" '
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
