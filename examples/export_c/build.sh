#!/usr/bin/env bash
# Export the kernels and build the example with g++ (no torch, no Python at link or run time).
# Usage: examples/export_c/build.sh [OUT_DIR]   (default: examples/export_c/build)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/build}"
mkdir -p "$out"
python3 -m opsmith export-c "$here/kernels.cu" -k relu -k 'axpy_f=axpy<float>' -k empty --prefix ex -o "$out" ${EXPORT_ARGS:-}
gcc -std=c99 -O2 -Wall -Wextra -Werror -c "$out/ex.c" -o "$out/ex.o"
g++ -std=c++17 -O2 -Wall -Wextra -Werror -I"$out" "$here/main.cpp" "$out/ex.o" -ldl -lpthread -o "$out/example"
echo "built $out/example"
