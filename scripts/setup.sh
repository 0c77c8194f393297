#!/usr/bin/env bash
# Set up opsmith on a fresh Debian/Ubuntu machine: clang (fastest torch precompiled headers),
# ninja, torch (CPU build unless one is installed), opsmith itself, and with --test the test deps.
# Usage: bash scripts/setup.sh [--test]
#
# Quiet on success: pip runs with -qq (errors still print, warnings do not: a root user's
# "Running pip as the 'root' user", an index's "Location ... is ignored", build-backend notices),
# apt-get's output is shown only when it fails. The last line says what was installed.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1   # env, not flags: an old pip ignores them
PIP=(python -m pip install -qq)

quiet() {  # run "$@" with its output kept; print that output only if it fails
  local log rc=0
  log="$(mktemp)"
  "$@" >"$log" 2>&1 || rc=$?
  [ "$rc" = 0 ] || cat "$log" >&2
  rm -f "$log"
  return "$rc"
}
apt_install() {
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

if ! command -v clang++ >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  # clang's precompiled headers cut a torch/extension.h compile from ~29 s to ~4 s (gcc: ~10 s).
  # opsmith works with gcc alone; clang is only faster.
  { quiet $SUDO apt-get update -qq && quiet apt_install clang; } || echo "setup: clang not installed; opsmith will use gcc"
fi
if [ "${1:-}" = "--test" ] && ! command -v redis-server >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  # The cluster-cache tests start a real redis-server on a loopback port (they skip without one).
  apt_install redis-server >/dev/null 2>&1 \
    || { quiet $SUDO apt-get update -qq && quiet apt_install redis-server; } \
    || echo "setup: redis-server not installed; the Redis cache tests will skip and say why"
fi
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! python -c "import torch" >/dev/null 2>&1; then
  # Any torch>=2.4 works. Prefer a wheel already on the machine (pip's find-links), then the
  # small CPU build, then PyPI's default (which pulls several GB of CUDA libraries).
  "${PIP[@]}" --no-index --no-deps "torch>=2.4" 2>/dev/null \
    || "${PIP[@]}" --no-deps "torch>=2.4" --index-url https://download.pytorch.org/whl/cpu 2>/dev/null \
    || true
  "${PIP[@]}" "torch>=2.4"   # torch's own dependencies (or torch itself, if none above worked)
fi
EXTRAS="cuda"
[ "${1:-}" = "--test" ] && EXTRAS="test,cuda"
"${PIP[@]}" -e ".[${EXTRAS}]"
if [ "${1:-}" = "--test" ] && ! command -v nvcc >/dev/null 2>&1; then
  # nvcc from PyPI (no GPU needed): the CUDA-extension tests compile .cu files on CI too.
  "${PIP[@]}" "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-cccl==13.0.*" \
    "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-crt==13.0.*" "nvidia-nvvm==13.0.*" \
    || echo "setup: nvcc wheels not installed; the nvcc tests will skip and say why"
fi
if ! command -v opsmith >/dev/null 2>&1; then  # pip's own warning about this is quieted above
  echo "setup: the opsmith command is not on PATH: add the directory pip put it in" \
    "(python -m pip show -f opsmith), or run python -m opsmith demo" >&2
fi
python -c "import opsmith, torch; print('setup: opsmith', opsmith.__version__, 'with torch', torch.__version__)"
