"""One factor at a time: does the compiler, the C++ standard, the -O level or the precompiled
header change how fast the LLTM module (bench/lltm/lltm.cpp) runs?

    OMP_NUM_THREADS=1 python bench/lltm/diag_runtime_flags.py [VARIANT ...] [--calls 2000]

Each variant compiles lltm.cpp by hand, with torch's include directories and defines, into its
own module (built once into --dir, reused when there), and reports its compile time; then
every module is loaded into this one process and timed: 2,000 forward calls on float64 CPU
tensors (16x32 input, state 128), best of three rounds taken in turn over the variants, so
that a busy spell on a shared machine does not land on one variant only. Variants named
`...pch` compile with a clang precompiled `torch/extension.h` built with the variant's own
flags (`pchi`: with `-fpch-instantiate-templates`, as opsmith builds it).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sysconfig
import tempfile
import time

import torch

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lltm.cpp")
TORCH_INCLUDE = os.path.join(os.path.dirname(torch.__file__), "include")
TORCH_LIB = os.path.join(os.path.dirname(torch.__file__), "lib")

# name: (compiler, flags, precompiled-header flags or None)
VARIANTS = {
    "gcc-c++20": ("g++", ["-std=c++20"], None),          # torch 2.13's JIT build (`c++` is g++ here)
    "gcc-c++17": ("g++", ["-std=c++17"], None),          # torch 2.11's
    "clang-c++20": ("clang++", ["-std=c++20"], None),    # opsmith's default compiler, torch's standard
    "clang-c++17": ("clang++", ["-std=c++17"], None),
    "clang-c++20-pchi": ("clang++", ["-std=c++20"], ["-fpch-instantiate-templates"]),  # opsmith's PCH
    "clang-c++20-pch": ("clang++", ["-std=c++20"], []),
    "gcc-c++20-O2": ("g++", ["-std=c++20", "-O2"], None),
    "clang-c++20-O2": ("clang++", ["-std=c++20", "-O2"], None),
    "clang-c++20-O2-pchi": ("clang++", ["-std=c++20", "-O2"], ["-fpch-instantiate-templates"]),
}


def _module_name(variant: str) -> str:
    return "lltm_" + variant.replace("-", "_").replace("+", "p")


def build(variant: str, out_dir: str) -> tuple[str, float | None, float | None]:
    """The module's path, and the seconds its PCH and its compile took (None: already built)."""
    cxx, flags, pch = VARIANTS[variant]
    name = _module_name(variant)
    so = os.path.join(out_dir, name + ".so")
    if os.path.exists(so):
        return so, None, None
    common = ["-DTORCH_API_INCLUDE_EXTENSION_H", "-isystem", TORCH_INCLUDE,
              "-isystem", os.path.join(TORCH_INCLUDE, "torch", "csrc", "api", "include"),
              "-isystem", sysconfig.get_paths()["include"], "-fPIC",
              f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", *flags]
    pch_s, extra = 0.0, [f"-DTORCH_EXTENSION_NAME={name}"]
    if pch is not None:
        # As opsmith does: the PCH is built with a constant extension name; a forced include
        # after it sets the module's own.
        header = os.path.join(out_dir, f"{name}_pch.h")
        with open(header, "w") as f:
            f.write("#include <torch/extension.h>\n")
        rename = os.path.join(out_dir, f"{name}_name.h")
        with open(rename, "w") as f:
            f.write(f"#undef TORCH_EXTENSION_NAME\n#define TORCH_EXTENSION_NAME {name}\n")
        t = time.perf_counter()
        subprocess.run([cxx, "-DTORCH_EXTENSION_NAME=opsmith_ext", *common, "-x", "c++-header", header,
                        *pch, "-o", header + ".pch"], check=True)
        pch_s = time.perf_counter() - t
        extra = ["-DTORCH_EXTENSION_NAME=opsmith_ext", "-include-pch", header + ".pch", "-include", rename]
    t = time.perf_counter()
    subprocess.run([cxx, *extra, *common, "-c", SOURCE, "-o", so + ".o"], check=True)
    compile_s = time.perf_counter() - t
    subprocess.run([cxx, so + ".o", "-shared", f"-L{TORCH_LIB}", "-lc10", "-ltorch_cpu", "-ltorch",
                    "-ltorch_python", "-o", so], check=True)
    return so, pch_s, compile_s


def time_round(module, calls: int) -> float:
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, dtype=torch.float64, generator=g)
    X, h, c, W, B = rand(16, 32), rand(16, 128), rand(16, 128), rand(384, 160), rand(1, 384)
    for _ in range(50):
        module.forward(X, W, B, h, c)
    t = time.perf_counter()
    for _ in range(calls):
        module.forward(X, W, B, h, c)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="*", help=f"default: all of {', '.join(VARIANTS)}")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "opsmith-diag-runtime-flags"))
    args = ap.parse_args()
    names = args.variants or list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    os.makedirs(args.dir, exist_ok=True)
    modules = {}
    for name in names:
        so, pch_s, compile_s = build(name, args.dir)
        if compile_s is not None:
            print(f"built {name}: compile {compile_s:.1f} s" + (f", PCH {pch_s:.1f} s" if pch_s else ""),
                  flush=True)
        spec = importlib.util.spec_from_file_location(_module_name(name), so)
        modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(modules[name])
    best = {name: float("inf") for name in names}
    for _ in range(3):
        for name in names:
            best[name] = min(best[name], time_round(modules[name], args.calls))
    print(f"{args.calls} forward calls, best of 3 rounds, torch threads {torch.get_num_threads()}:")
    for name in names:
        print(f"  {name:22s} {best[name]:.3f} s")


if __name__ == "__main__":
    main()
