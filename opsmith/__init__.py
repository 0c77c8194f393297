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

from ._config import settings
from ._errors import (CacheError, CompileError, ConfigError, LaunchError, LinkError, OpsmithError,
                      SpecError, ToolchainError)
from ._version import __version__

# public name -> private module that defines it (imported lazily on first access)
_LAZY = {
    # C++ / CUDA extensions (torch.utils.cpp_extension drop-ins)
    "load": "._extension",
    "load_inline": "._extension",
    "build": "._extension",
    "build_inline": "._extension",
    "load_artifact": "._extension",
    "Artifact": "._extension",
    # --- NVRTC kernels (issue 3): add names here ---
    "CudaModule": "._kernel",
    "Kernel": "._kernel",
    "LaunchConfig": "._kernel",
    "KernelAttributes": "._kernel",
    "cuda_kernel": "._kernel",
    "compile_cuda": "._nvrtc",
    "CudaBinary": "._nvrtc",
    # --- end NVRTC kernels ---
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
    from ._extension import Artifact, build, build_inline, load, load_artifact, load_inline
    from ._kernel import CudaModule, Kernel, KernelAttributes, LaunchConfig, cuda_kernel
    from ._nvrtc import CudaBinary, compile_cuda
