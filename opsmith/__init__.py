"""opsmith: C++ and CUDA source to PyTorch ops and Python modules, fast, cached and robust.

``import opsmith`` is cheap: it finds no compiler, creates no directory, touches no GPU and
imports neither torch nor cuda-bindings. Each public name below is imported on first use.

Examples
--------
>>> import opsmith
>>> opsmith.__version__
'0.1.0'
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from opsmith._config import settings
from opsmith._errors import (CacheError, CompileError, ConfigError, LaunchError, LinkError, OpsmithError,
                      SpecError, ToolchainError)
from opsmith._version import __version__

# public name -> private module that defines it (imported lazily on first access)
_LAZY = {
    # C++ / CUDA extensions (torch.utils.cpp_extension drop-ins)
    "load": "opsmith._torch._extension",
    "load_inline": "opsmith._torch._extension",
    "build": "opsmith._torch._extension",
    "build_inline": "opsmith._torch._extension",
    "load_artifact": "opsmith._torch._extension",
    "Artifact": "opsmith._torch._extension",
    "build_shared_library": "opsmith._build._profile_shared",
    # --- NVRTC kernels (issue 3): add names here ---
    "CudaModule": "opsmith._torch._cuda_module",
    "Kernel": "opsmith._torch._kernel",
    "LaunchConfig": "opsmith._runtime._launch_config",
    "KernelAttributes": "opsmith._runtime._launch_config",
    "cuda_kernel": "opsmith._torch._cuda_module",
    "compile_cuda": "opsmith._build._nvrtc",
    "CudaBinary": "opsmith._build._nvrtc",
    "compile_many": "opsmith._build._many",
    # --- end NVRTC kernels ---
    "export_c": "opsmith.export_c",  # the package, which is also callable as the function
    "CExport": "opsmith.export_c",
    # kernels and extension functions as torch ops (issue 12)
    "custom_op": "opsmith._torch._ops",
    "CustomOp": "opsmith._torch._ops",
    "Out": "opsmith._torch._outspec",
    "Elementwise": "opsmith._torch._elementwise",
    # ops shipped as wheels (issue 21)
    "build_package": "opsmith.package",
    "load_package": "opsmith.package",
}

__all__ = sorted([
    "__version__", "settings", "OpsmithError", "SpecError", "ConfigError", "ToolchainError",
    "CompileError", "LinkError", "CacheError", "LaunchError", *_LAZY,
])


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'opsmith' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__


if TYPE_CHECKING:  # pragma: no cover
    from opsmith._build._profile_shared import build_shared_library
    from opsmith._torch._extension import Artifact, build, build_inline, load, load_artifact, load_inline
    from opsmith._runtime._launch_config import KernelAttributes, LaunchConfig
    from opsmith._torch._cuda_module import CudaModule, cuda_kernel
    from opsmith._torch._kernel import Kernel
    from opsmith._build._nvrtc import CudaBinary, compile_cuda
    from opsmith._build._many import compile_many
    from opsmith._torch._ops import CustomOp, custom_op
    from opsmith._torch._outspec import Out
