"""The CUDA sources of opsmith.ops and their compiled modules.

One NVRTC program per (source file, element type): ``elementwise.cu``, ``softmax.cu`` and
``norm.cu`` for float32, float64, float16 and bfloat16, each with the name expressions of its
kernels. The first use of any op on a dtype compiles that dtype's three programs at once
(:func:`opsmith.compile_many`); ``opsmith warm --ops`` compiles all of them ahead of time.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

__all__ = ["DTYPES", "FILES", "KERNEL_DIR", "jobs", "kernel", "kernel_list", "kernel_names", "warm"]

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"

# torch dtype name -> (C++ element type, accumulation type)
DTYPES: dict[str, tuple[str, str]] = {
    "float32": ("float", "float"), "float16": ("__half", "float"),
    "bfloat16": ("__nv_bfloat16", "float"), "float64": ("double", "double"),
}

# source file -> kernel templates ({T}: element type, {A}: accumulation type)
FILES: dict[str, tuple[str, ...]] = {
    "elementwise.cu": tuple(f"{op}_{d}<{{T}}>" for op in ("relu", "gelu_erf", "gelu_tanh", "silu")
                            for d in ("fwd", "bwd")),
    "softmax.cu": tuple(f"softmax_{d}{s}<{{T}}>" for d in ("fwd", "bwd") for s in ("", "_long")),
    "norm.cu": tuple(f"{op}_{d}{s}<{{T}}, {{A}}>" for op in ("layer_norm", "rms_norm")
                     for d in ("fwd", "bwd") for s in ("", "_long")) + ("norm_bwd_weight<{T}, {A}>",),
}


def kernel_names(file: str, dtype: str) -> list[str]:
    """The name expressions of ``file``'s kernels for ``dtype`` (``"relu_fwd<__half>"``)."""
    t, a = DTYPES[dtype]
    return [n.format(T=t, A=a) for n in FILES[file]]


def jobs(arch: str, dtypes=tuple(DTYPES), files=tuple(FILES)) -> list[dict[str, Any]]:
    """compile_many jobs for ``files`` x ``dtypes`` on ``arch``."""
    return [{"source": KERNEL_DIR / f, "name_expressions": kernel_names(f, d), "arch": arch,
             "name": f"opsmith/ops/kernels/{f}"} for d in dtypes for f in files]


def warm(arch: str, dtypes=tuple(DTYPES), *, max_workers: int | None = None, progress: bool | None = None):
    """Compile every program for ``arch`` at once (cache hits cost a lookup); their binaries."""
    from opsmith._build._many import compile_many
    return compile_many(jobs(arch, dtypes), max_workers=max_workers, progress=progress,
                        title="compiling opsmith.ops kernels")


_modules: dict[tuple[str, str, int], Any] = {}
_lock = threading.Lock()


def kernel(file: str, name: str, dtype: str, device: int):
    """The kernel ``name`` (a template from FILES, e.g. ``"relu_fwd<{T}>"``) for ``dtype`` on
    CUDA ``device``; the first call for a dtype compiles its programs concurrently."""
    mod = _modules.get((file, dtype, device))
    if mod is None:
        with _lock:
            mod = _modules.get((file, dtype, device))
            if mod is None:
                from opsmith._runtime import _driver
                from opsmith._torch._cuda_module import CudaModule
                arch = _driver.device_arch(device)
                warm(arch, (dtype,))  # this dtype's programs, all at once
                for f in FILES:
                    _modules[(f, dtype, device)] = CudaModule(
                        KERNEL_DIR / f, name_expressions=kernel_names(f, dtype), arch=arch,
                        name=f"opsmith/ops/kernels/{f}")
                mod = _modules[(file, dtype, device)]
    t, a = DTYPES[dtype]
    return mod.get_kernel(name.format(T=t, A=a))


_lists: dict[tuple[str, str, str | None], list] = {}
_arch_free: dict[tuple[str, str, str | None], Any] = {}  # (file, dtype, arch) -> module of kernel_list


def kernel_list(file: str, template: str, arch: str | None = None) -> list:
    """One kernel per dtype (float32, float16, bfloat16, float64) of ``template`` in ``file``, for
    a kernel op (``custom_op(kernel=[...])``: the dtype of the first input picks). ``arch``
    None: the modules compile for each device's own arch on first use there (this device's
    now, all dtypes at once)."""
    key = (file, template, arch)
    got = _lists.get(key)
    if got is not None:
        return got
    with _lock:
        from opsmith._build._many import compile_many
        from opsmith._runtime import _driver
        from opsmith._torch._cuda_module import CudaModule
        if arch is None:
            import torch
            compile_many(jobs(_driver.device_arch(torch.cuda.current_device()), files=(file,)),
                         title="compiling opsmith.ops kernels")
        mods = [_arch_free.get((file, d, arch)) or CudaModule(KERNEL_DIR / file, name_expressions=kernel_names(file, d),
                                                          arch=arch, name=f"opsmith/ops/kernels/{file}")
                for d in DTYPES]
        for d, m in zip(DTYPES, mods):
            _arch_free[(file, d, arch)] = m  # the module of (file, dtype), shared by the ops of the file
        got = _lists[key] = [m.get_kernel(template.format(T=t, A=a)) for m, (t, a) in zip(mods, DTYPES.values())]
    return got
