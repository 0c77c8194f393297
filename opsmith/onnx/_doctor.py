"""The doctor's ONNX Runtime rows: ORT and its providers, whether CPU functions get ORT's
threads, the CUDA provider's libraries (naming the missing one and the fix), and the opsmith op
libraries built under the cache. ``opsmith doctor`` (the CLI) shows them."""
from __future__ import annotations

import ctypes
import re
from pathlib import Path

from opsmith.onnx._generate import PARALLEL_FOR_API_VERSION
from opsmith.onnx._session import ORT_EXTRA

__all__ = ["doctor_rows"]

_FIXES = {
    "libcudnn": "cuDNN 9 is missing: pip install nvidia-cudnn-cu12 (or -cu13 for the CUDA 13 build), or "
                "call onnxruntime.preload_dlls() before the session (ORT >= 1.21 finds pip-installed CUDA "
                "libraries)",
    "libcudart": "the CUDA runtime is missing: pip install nvidia-cuda-runtime-cu12 (or -cu13), or put the "
                 "toolkit's lib64 on LD_LIBRARY_PATH",
    "libcublas": "cuBLAS is missing: pip install nvidia-cublas-cu12 (or -cu13)",
    "libcufft": "cuFFT is missing: pip install nvidia-cufft-cu12 (or -cu13)",
    "libcurand": "cuRAND is missing: pip install nvidia-curand-cu12 (or -cu13)",
}


def _missing_library_fix(message: str) -> tuple[str, str]:
    m = re.search(r"(lib[\w.+-]+\.so[\w.]*): cannot open shared object file", message)
    if not m:
        return message.strip().splitlines()[0][:200], "reinstall onnxruntime-gpu matching your CUDA major version"
    name = m.group(1)
    fix = next((v for k, v in _FIXES.items() if name.startswith(k)),
               f"install the package that ships {name} or add its directory to LD_LIBRARY_PATH")
    return f"{name} cannot be loaded", fix


def _cpu_threads_row(version: str) -> tuple[str, str, str, str]:
    """Whether an ORT of ``version`` gives opsmith CPU functions its intra-op threads
    (``KernelContext_ParallelFor``, C API 17: ORT 1.17)."""
    parts = [int(p) for p in re.findall(r"\d+", version)[:2]] + [0, 0]
    if (parts[0], parts[1]) >= (1, PARALLEL_FOR_API_VERSION):
        return ("ORT CPU threads", "ok", "CPU functions of opsmith op libraries run on ORT's intra-op threads "
                "(KernelContext_ParallelFor)", "")
    return ("ORT CPU threads", "warning",
            f"ORT {version} has no KernelContext_ParallelFor: CPU functions of opsmith op libraries "
            f"(opsmith::cpu_context::parallel_for) run on the calling thread only",
            f"pip install -U 'onnxruntime>=1.{PARALLEL_FOR_API_VERSION}' (or onnxruntime-gpu)")


def doctor_rows(cache_root: Path) -> list[tuple[str, str, str, str]]:
    """(name, status, found, fix) rows: ORT and its providers, whether CPU ops get ORT's threads,
    the CUDA provider's libraries, the opsmith op libraries built under ``cache_root/ort``."""
    try:
        import onnxruntime as ort
    except ImportError:
        return [("ONNX Runtime", "ok", "not installed (needed only for opsmith.onnx)", "")]
    except Exception as exc:  # noqa: BLE001 - a broken install is a finding
        return [("ONNX Runtime", "problem", f"import failed: {type(exc).__name__}: {exc}",
                 f"reinstall it: pip install -U onnxruntime ({ORT_EXTRA})")]
    rows = []
    providers = ort.get_available_providers()
    rows.append(("ONNX Runtime", "ok", f"{ort.__version__} ({Path(ort.__file__).parent}), providers: "
                 f"{', '.join(providers)}", ""))
    rows.append(_cpu_threads_row(ort.__version__))
    if "CUDAExecutionProvider" in providers:
        capi = Path(ort.__file__).parent / "capi"
        cuda_lib = capi / "libonnxruntime_providers_cuda.so"
        shared = capi / "libonnxruntime_providers_shared.so"
        try:
            if hasattr(ort, "preload_dlls"):
                try:
                    ort.preload_dlls()
                except Exception:  # noqa: BLE001 - the load below says what is missing
                    pass
            if shared.exists():
                ctypes.CDLL(str(shared), mode=ctypes.RTLD_GLOBAL)
            ctypes.CDLL(str(cuda_lib))
            rows.append(("ORT CUDA provider", "ok", f"{cuda_lib.name} and its CUDA libraries load", ""))
        except OSError as exc:
            found, fix = _missing_library_fix(str(exc))
            rows.append(("ORT CUDA provider", "warning",
                         f"listed, but {found}: sessions asking for it fall back to the CPU", fix))
    else:
        rows.append(("ORT CUDA provider", "ok", "not in this build (pip install onnxruntime-gpu for it)", ""))
    libs = sorted((cache_root / "ort").glob("*/lib*.so"), key=lambda p: p.stat().st_mtime, reverse=True) \
        if (cache_root / "ort").is_dir() else []
    if not libs:
        rows.append(("opsmith ORT op library", "ok", "none built yet (opsmith.onnx.build_library)", ""))
    for lib in libs[:3]:
        try:
            so = ort.SessionOptions()
            so.register_custom_ops_library(str(lib))
            rows.append(("opsmith ORT op library", "ok", f"{lib} loads", ""))
        except Exception as exc:  # noqa: BLE001
            rows.append(("opsmith ORT op library", "problem", f"{lib} does not load: {exc}",
                         "rebuild it with opsmith.onnx.build_library (an ORT older than 1.10 cannot load it)"))
    return rows
