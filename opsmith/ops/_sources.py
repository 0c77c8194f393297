"""The CUDA sources of opsmith.ops and their compiled modules.

One NVRTC program per (source file, element type): ``elementwise.cu``, ``softmax.cu``,
``softmax_cluster.cu``, ``norm.cu``, ``norm_long.cu``, ``norm_cluster.cu``, ``norm_l2.cu``, ``norm_split.cu``,
``norm_small.cu``, ``gated.cu``, ``fused_norm.cu``, ``rotary.cu``, ``rotary_ip.cu`` and ``cross_entropy.cu`` for float32, float64,
float16 and bfloat16, each with the name expressions of its kernels. The first use of any op on a dtype
compiles that dtype's programs at once (:func:`opsmith.compile_many`); ``opsmith warm --ops`` compiles all
of them ahead of time.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

__all__ = ["DTYPES", "FILES", "NATIVE_FILES", "KERNEL_DIR", "jobs", "kernel", "kernel_names", "warm"]

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
    "softmax.cu": tuple(f"softmax_{d}{s}<{{T}}>" for d in ("fwd", "bwd") for s in ("", "_long"))
    + ("softmax_fwd_full<{T}>", "softmax_fwd_wide_full<{T}>", "softmax_fwd_wide3<{T}>", "softmax_fwd_wide3_full<{T}>")
    + tuple(f"softmax_{d}_wide<{{T}}, {c}>" for d in ("fwd", "bwd") for c in (4, 8))  # 8: float rows past 4
    + ("softmax_bwd_wide_sm<{T}, 8>",),  # grad_y staged in shared memory
    "norm.cu": tuple(f"{op}_{d}<{{T}}, {{A}}>" for op in ("layer_norm", "rms_norm") for d in ("fwd", "bwd"))
    + ("layer_norm_fwd_wide<{T}, {A}>", "layer_norm_fwd4<{T}, {A}>", "layer_norm_fwd_c4<{T}, {A}>",
       "rms_norm_fwd_c4<{T}, {A}>", "layer_norm_fwd_c4_full<{T}, {A}>", "rms_norm_fwd_c4_full<{T}, {A}>",
       "layer_norm_fwd_full<{T}, {A}>",
       "layer_norm_fwd_c8<{T}, {A}>", "rms_norm_fwd_c8<{T}, {A}>", "layer_norm_bwd_res<{T}, {A}>",
       "layer_norm_bwd_c4<{T}, {A}>", "layer_norm_bwd_c4_res<{T}, {A}>", "rms_norm_bwd_c4<{T}, {A}>",
       "layer_norm_bwd_sm<{T}, {A}>", "layer_norm_bwd_sm_res<{T}, {A}>", "rms_norm_bwd_sm<{T}, {A}>"),
    "softmax_cluster.cu": tuple(f"softmax_{d}_cluster<2, {c}, {{T}}>" for d in ("fwd", "bwd") for c in (2, 4))
    + ("softmax_fwd_cluster<4, 4, {T}>",),  # _launch.softmax_plan's forward of 16,385-20,480 16-bit columns
    "norm_long.cu": tuple(f"{op}_{d}_long<{{T}}, {{A}}>" for op in ("layer_norm", "rms_norm")
                          for d in ("fwd", "bwd")) + ("layer_norm_bwd_long_res<{T}, {A}>",),
    "norm_cluster.cu": tuple(f"{op}_fwd_cluster<2, {c}, {{T}}, {{A}}>" for op in ("layer_norm", "rms_norm", "add_rms_norm")
                             for c in (2, 4))  # _launch_norm.norm_cluster_plan's: K, then chunks a thread
    + tuple(f"{op}_bwd_cluster<{k}, {{T}}, {{A}}>" for op in ("layer_norm", "rms_norm") for k in (2, 8))
    + tuple(f"layer_norm_bwd_cluster_res<{k}, {{T}}, {{A}}>" for k in (2, 8)),
    "norm_l2.cu": tuple(f"{op}_fwd_l2<{b}, {{T}}, {{A}}>" for op in ("layer_norm", "rms_norm", "add_rms_norm",
                                                                     "add_layer_norm")
                        for b in (2, 1))  # blocks an SM: _launch_norm.l2_kernel
    + ("layer_norm_fwd_l2<3, {T}, {A}>", "rms_norm_fwd_l2<3, {T}, {A}>"),  # 3 blocks of 512: rows of 16-32 KiB
    "norm_split.cu": ("layer_norm_bwd_dx<{T}, {A}>", "rms_norm_bwd_dx<{T}, {A}>", "norm_bwd_weight<{T}, {A}>",
                      "norm_bwd_weight_cluster<{T}, {A}>", "norm_col_sum<{T}, {A}>"),
    "norm_small.cu": ("layer_norm_bwd_small<{T}, {A}>", "rms_norm_bwd_small<{T}, {A}>"),
    "gated.cu": tuple(f"{op}_and_mul_{d}<{{T}}>" for op in ("silu", "gelu", "gelu_tanh") for d in ("fwd", "bwd"))
    + tuple(f"{op}_and_mul_{d}_one<{{T}}>" for op in ("silu", "gelu_tanh") for d in ("fwd", "bwd")),
    "fused_norm.cu": ("add_rms_norm_fwd<{T}, {A}>", "add_rms_norm_fwd_full<{T}, {A}>", "add_rms_norm_fwd_c8<{T}, {A}>",
                      "add_rms_norm_fwd_c8k<{T}, {A}>", "add_layer_norm_fwd<{T}, {A}>",
                      "add_layer_norm_fwd_full<{T}, {A}>", "add_layer_norm_fwd_c4<{T}, {A}>",
                      "add_layer_norm_fwd_c4_full<{T}, {A}>"),
    "rotary.cu": ("rotary<{T}>", "rotary_full<{T}>", "rotary_qk<{T}>", "rotary_qk_full<{T}>", "rotary_lean<{T}>"),
    "rotary_ip.cu": ("rotary_ip<{T}>", "rotary_ip_full<{T}>", "rotary_qk_ip<{T}>", "rotary_qk_ip_full<{T}>"),
    "cross_entropy.cu": ("cross_entropy_fwd<{T}, {A}, true>", "cross_entropy_fwd<{T}, {A}, false>",
                         "cross_entropy_finish<{T}, {A}>", "cross_entropy_bwd<{T}, {A}>"),
}

# the files whose kernels the C++ library (native/osm_ops.cpp) launches; the others' ops keep
# their Python CUDA implementations (opsmith/ops/_functional.py) on every machine
NATIVE_FILES = ("elementwise.cu", "softmax.cu", "softmax_cluster.cu", "norm.cu", "norm_long.cu", "norm_cluster.cu",
                "norm_l2.cu", "norm_split.cu", "norm_small.cu")


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
