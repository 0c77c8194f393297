#!/usr/bin/env bash
# Can this machine's g++ build torch/extension.h as a C++20 header unit, and how fast is an
# importer? (an experiment for the two-file cold build; prints what happened)
set -u
W=$(mktemp -d); cd "$W"
TI=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__)+'/include')")
PI=$(python3 -c "import sysconfig;print(sysconfig.get_paths()['include'])")
F="-DTORCH_EXTENSION_NAME=m -DTORCH_API_INCLUDE_EXTENSION_H -isystem $TI -isystem $TI/torch/csrc/api/include -isystem $PI -fPIC -std=c++17 -D_GLIBCXX_USE_CXX11_ABI=1"
echo "== header unit build"
/usr/bin/time -f "TIME %e s" timeout 240 g++ $F -fmodules-ts -fmodule-header -x c++-header $TI/torch/extension.h 2>&1 | tail -5
ls -la gcm.cache 2>/dev/null | head -3; find gcm.cache -name "*.gcm" -exec ls -la {} \; 2>/dev/null | head -3
printf 'import "%s";\nint f(){return 1;}\n' "$TI/torch/extension.h" > imp.cpp
echo "== importer"
/usr/bin/time -f "TIME %e s" timeout 120 g++ $F -fmodules-ts -c imp.cpp -o imp.o 2>&1 | tail -5
