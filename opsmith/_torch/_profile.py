"""The ``torch-extension`` profile: what a torch C++/CUDA extension needs from the engine.

torch's flags (its include directories, ``TORCH_EXTENSION_NAME``, the C++ ABI and standard),
its libraries (read through link stubs), the precompiled ``torch/extension.h``, torch's and
Python's identities in every key, and the check that CUDA sources meet a CUDA build of torch.
"""
from __future__ import annotations

import os

from opsmith._build._profile import Profile
from opsmith._config import settings
from opsmith._errors import ToolchainError
from opsmith._spec import MODULE_NAME
from opsmith._toolchain import _archs, _libstdcxx
from opsmith._toolchain._cxx import python_abi
from opsmith._toolchain._nvcc import COMMON_NVCC_FLAGS, has_ccbin, torch_nvcc_std

__all__ = ["TorchExtension", "MODULE_NAME"]



class TorchExtension(Profile):
    name = "torch-extension"
    uses_torch = True
    # torch's builder gives every source but .cu to its C++ compiler with its C++ flags, and
    # g++ (its default, `c++`) compiles a .c as C++: a drop-in does the same. The engine adds
    # `-x c++`, which clang++ needs to do so without a deprecation warning.
    c_as_cxx = True

    def key_parts(self, spec, tc) -> list[str]:
        return [f"torch={tc.torch.fingerprint}", f"python={python_abi()}"]

    def cxx_flags(self, spec, tc) -> list[str]:
        return _cxx_flags(spec, tc) + _module_name_flags(spec, tc)

    def pch_flags(self, spec, tc) -> list[str]:
        """The flags the precompiled torch header is built with (shared by every extension)."""
        return _cxx_flags(spec, tc)

    def cuda_flags(self, spec, tc) -> list[str]:
        """nvcc's flags for the CUDA sources of ``spec`` (without -c, -o and depfile options)."""
        user = list(spec.extra_cuda_cflags)
        nvcc = tc.nvcc
        nvcc.check_host(user)
        flags = [] if has_ccbin(user) else ["-ccbin", nvcc.host]
        if spec.kind != "executable":
            name = getattr(spec, "module_name", None) or MODULE_NAME
            flags += [f"-DTORCH_EXTENSION_NAME={name}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
        flags += ["-DWITH_CUDA"]
        flags += [f"-I{p}" for p in spec.extra_include_paths]
        for inc in (*tc.torch.include_dirs, tc.python_include, *nvcc.include_dirs):
            flags += ["-isystem", inc]
        flags += [f"-D_GLIBCXX_USE_CXX11_ABI={tc.torch.cxx11_abi}", *COMMON_NVCC_FLAGS,
                  "-Xcompiler", "-fPIC"]
        if not any("arch" in f for f in user if "TORCH_EXTENSION_NAME" not in f):  # torch's rule
            archs = _archs.resolve_archs(settings.cuda_arch_list, nvcc_archs=nvcc.archs,
                                         cuda_versions=_cuda_versions(tc),
                                         state=getattr(tc, "state", None))
            flags += _archs.gencode_flags(archs)
            if len(archs) > 1 and not any(f in ("-t", "--threads") or f.startswith(("--threads=", "-t="))
                                            for f in user):
                # one nvcc builds several archs on as many threads: still one fat binary
                flags += ["--threads", str(min(len(archs), 8))]
        if not any(f.startswith(("-std=", "--std")) for f in user):
            flags.append(f"-std={torch_nvcc_std(tc)}")
        flags += user
        return flags

    def ldflags(self, spec, tc) -> list[str]:
        return _ldflags(spec, tc)

    def uses_pch(self, source) -> bool:
        return source.includes_torch_extension

    def link_stubs(self, spec, ldflags) -> bool:
        from opsmith._build import _linkstubs
        return _linkstubs.wanted(spec.kind, ldflags)

    def inputs(self, spec, tc) -> list[str]:
        return [os.path.join(tc.torch.include_dirs[0], "torch", "extension.h")]

    def check(self, spec, tc) -> None:
        if spec.with_cuda:
            _require_cuda_torch(spec, tc)


def _cuda_versions(tc) -> tuple[str, ...]:
    out = [tc.nvcc.version]
    if tc.torch.cuda:
        out.append(".".join(str(tc.torch.cuda).split(".")[:2]))
    return tuple(out)


def _has_opt_flag(flags) -> bool:
    return any(f.startswith("-O") for f in flags)


def _cxx_flags(spec, tc) -> list[str]:
    flags = []
    if spec.kind != "executable":
        flags += [f"-DTORCH_EXTENSION_NAME={MODULE_NAME}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    if spec.with_cuda:
        flags += ["-DWITH_CUDA"]
    flags += [f"-I{p}" for p in spec.extra_include_paths]
    for inc in (*tc.torch.include_dirs, tc.python_include):
        flags += ["-isystem", inc]
    if spec.with_cuda:
        for inc in tc.nvcc.include_dirs:
            flags += ["-isystem", inc]
    flags += ["-fPIC", f"-std={tc.torch.std}", f"-D_GLIBCXX_USE_CXX11_ABI={tc.torch.cxx11_abi}"]
    if not _has_opt_flag(spec.extra_cflags) and settings.opt_level:
        flags.append(settings.opt_level)
    flags += list(spec.extra_cflags)
    return flags


def _module_name_flags(spec, tc) -> list[str]:
    """For a real module name (setuptools builds): redefine TORCH_EXTENSION_NAME after the PCH.

    The command line keeps the constant, so the shared precompiled torch header stays valid
    (clang refuses a PCH whose -D differs); a forced include, after the PCH's, redefines it.
    """
    if not spec.module_name or spec.kind == "executable":
        return []
    path = tc.cache.workspace.stable_dir("module-names") / f"{spec.module_name}.h"
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(f"#undef TORCH_EXTENSION_NAME\n#define TORCH_EXTENSION_NAME {spec.module_name}\n")
        os.replace(tmp, path)
    return ["-include", os.fspath(path)]


def _ldflags(spec, tc) -> list[str]:
    flags = [] if spec.kind == "executable" else ["-shared"]
    flags += list(spec.extra_ldflags)
    flags += [f"-L{tc.torch.lib_dir}", "-lc10"]
    # A CPU-only torch has no CUDA libraries: CUDA code still links (against cudart), for a
    # standalone program or for checking that it builds.
    torch_cuda = spec.with_cuda and os.path.exists(os.path.join(tc.torch.lib_dir, "libtorch_cuda.so"))
    if torch_cuda:
        flags += ["-lc10_cuda"]
    flags += ["-ltorch_cpu"]
    if spec.with_cuda:
        if torch_cuda:
            flags += ["-ltorch_cuda"]
        flags += tc.nvcc.link_flags()
    flags += ["-ltorch"]
    if spec.kind != "executable":
        flags += ["-ltorch_python"]
    else:
        flags += [f"-Wl,-rpath,{tc.torch.lib_dir}"]
    # one C++ runtime per process: a compiler that would link libstdc++.a links the shared one
    runtime = _libstdcxx.shared_runtime(tc.cxx, tc.state)
    return flags + ([runtime] if runtime else [])


def _require_cuda_torch(spec, tc) -> None:
    """CUDA sources need a CUDA build of torch: with a CPU-only one the module's kernel launches
    fail unchecked and an op silently returns garbage. OPSMITH_CUDA_WITH_CPU_TORCH=1 builds anyway."""
    if tc.torch.cuda or spec.kind == "executable" or settings.cuda_with_cpu_torch:
        return
    raise ToolchainError(
        f"{spec.name} has CUDA sources but torch {tc.torch.version} is a CPU-only build: the module "
        f"would build, but its kernels cannot run with this torch (an op would return unset memory). "
        f"Install a CUDA build of torch, e.g. `pip install torch --index-url "
        f"https://download.pytorch.org/whl/cu130` (pick your CUDA version at "
        f"https://pytorch.org/get-started/locally/), or set OPSMITH_CUDA_WITH_CPU_TORCH=1 to build "
        f"anyway (to check that the code compiles).")
