"""The doctor's CUDA checks: CUDA_HOME, nvcc, NVRTC, the driver and GPUs, the arch list."""
from __future__ import annotations

import os
import shutil

from opsmith._config import settings
from opsmith._errors import ConfigError, OpsmithError, ToolchainError

from opsmith.cli._doctor_base import CUDA_EXTRA, OK, PROBLEM, WARNING, Check, _Context, _fix_of, _run

__all__ = ["check_cuda_home", "check_nvcc", "check_nvrtc", "check_driver_and_gpus", "check_arch_list"]


def check_cuda_home(ctx: _Context) -> list[Check]:
    try:
        home = settings.cuda_home
    except ConfigError as exc:  # pragma: no cover - str settings never fail to parse
        return [Check("CUDA_HOME", PROBLEM, "invalid", _fix_of(exc))]
    var = "CUDA_HOME" if os.environ.get("CUDA_HOME") else "CUDA_PATH"
    if home:
        if not os.path.isdir(home):
            return [Check("CUDA_HOME", PROBLEM, f"{var}={home}, which does not exist",
                          f"Point {var} at the CUDA toolkit's root (the directory holding bin/nvcc), "
                          f"e.g. export {var}=/usr/local/cuda, or unset it.")]
        if not os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            return [Check("CUDA_HOME", PROBLEM, f"{var}={home} has no bin/nvcc",
                          f"Point {var} at the CUDA toolkit's root (the directory holding bin/nvcc), "
                          f"or install the toolkit there.")]
        return [Check("CUDA_HOME", OK, f"{var}={home}")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        return [Check("CUDA_HOME", OK, f"unset; the toolkit is found through nvcc on PATH ({nvcc})")]
    if os.access("/usr/local/cuda/bin/nvcc", os.X_OK):
        return [Check("CUDA_HOME", OK, "unset; the toolkit is found at /usr/local/cuda")]
    status = PROBLEM if ctx.torch_cuda else WARNING
    return [Check("CUDA_HOME", status, "unset, and no CUDA toolkit on PATH or in /usr/local/cuda",
                  "Install the CUDA toolkit (the version torch was built with) and set "
                  "CUDA_HOME to its root, e.g. export CUDA_HOME=/usr/local/cuda; only CUDA "
                  "extensions (.cu sources) need it.")]


def check_nvcc(ctx: _Context) -> list[Check]:
    try:
        from opsmith._toolchain._nvcc import find_nvcc
    except ImportError:
        return [Check("nvcc", WARNING, "check unavailable (this opsmith has no nvcc module)",
                      "Upgrade opsmith.")]
    status = PROBLEM if ctx.torch_cuda else WARNING
    try:
        nvcc = find_nvcc(ctx.cxx)
    except ToolchainError as exc:
        return [Check("nvcc", status, "not found or not usable" + ("" if ctx.torch_cuda else
                      " (only CUDA extensions need it)"), _fix_of(exc))]
    ctx.nvcc = nvcc
    rows = [Check("nvcc", OK, f"{nvcc.version} ({nvcc.path})")]
    rows += _cuda_versions(ctx, nvcc)
    return rows


def _major_minor(version: str | None) -> tuple[int, int] | None:
    try:
        parts = str(version).split(".")
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except (ValueError, IndexError):
        return None


def _torch_index(cuda_version: str) -> str:
    """PyTorch's wheel index for a CUDA version: ``13.0`` -> ``.../whl/cu130``."""
    mm = _major_minor(cuda_version)
    tag = f"cu{mm[0]}{mm[1]}" if mm else "cu130"
    return f"https://download.pytorch.org/whl/{tag}"


def _cuda_versions(ctx: _Context, nvcc) -> list[Check]:
    """torch's CUDA against the toolkit's: a major difference breaks builds, a minor one does not."""
    if not ctx.torch_cuda:
        return [Check("CUDA versions", WARNING, f"torch is a CPU-only build: CUDA extensions compile with "
                      f"nvcc {nvcc.version} but cannot use the GPU through torch",
                      f"Install a CUDA build of torch for the toolkit's CUDA {nvcc.version}, e.g. pip install "
                      f"torch --index-url {_torch_index(nvcc.version)}")]
    t, n = _major_minor(ctx.torch_cuda), _major_minor(nvcc.version)
    if t is None or n is None:
        return []
    if t[0] != n[0]:
        return [Check("CUDA versions", PROBLEM, f"torch was built with CUDA {ctx.torch_cuda}, nvcc is "
                      f"{nvcc.version}: a different major version",
                      f"Install CUDA toolkit {t[0]}.x and point CUDA_HOME at it, or install the torch "
                      f"build for CUDA {n[0]}.x.")]
    if t != n:
        return [Check("CUDA versions", OK, f"torch {ctx.torch_cuda}, nvcc {nvcc.version}: a minor-version "
                      f"difference, which CUDA's minor-version compatibility supports (nothing to do)")]
    return [Check("CUDA versions", OK, f"torch and nvcc both CUDA {nvcc.version}")]


def check_nvrtc(ctx: _Context) -> list[Check]:
    import importlib.util
    try:
        spec = importlib.util.find_spec("cuda.bindings")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return [Check("NVRTC", WARNING, "cuda-bindings is not installed: opsmith.cuda_kernel and "
                      "compile_cuda are unavailable", f"Install it: {CUDA_EXTRA}")]
    try:
        from opsmith._build._nvrtc import nvrtc_version
        version = nvrtc_version()
    except ImportError:
        return [Check("NVRTC", WARNING, "check unavailable", "Upgrade opsmith.")]
    except ToolchainError as exc:
        return [Check("NVRTC", WARNING, "libnvrtc could not be loaded", _fix_of(exc))]
    return [Check("NVRTC", OK, f"{version} (cuda-bindings)")]


def _nvidia_smi_gpus() -> list[tuple[str, str, str]] | None:
    """[(index, name, compute capability)] from nvidia-smi, or None when it cannot answer."""
    if not shutil.which("nvidia-smi"):
        return None
    proc = _run(["nvidia-smi", "--query-gpu=index,name,compute_cap", "--format=csv,noheader"])
    if proc is None or proc.returncode != 0:
        return None
    gpus = []
    for line in proc.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            gpus.append((parts[0], parts[1], parts[2]))
    return gpus


def _driver_gpus() -> list[tuple[str, str, str]]:
    import ctypes

    from opsmith._runtime import _driver
    lib = _driver.driver()
    count = ctypes.c_int()
    lib.cuDeviceGetCount(ctypes.byref(count))
    gpus = []
    for i in range(count.value):
        arch = _driver.device_arch(i)
        name = ctypes.create_string_buffer(256)
        dev = ctypes.c_int()
        lib.cuDeviceGet(ctypes.byref(dev), i)
        lib.cuDeviceGetName(name, 256, dev)
        cc = f"{arch[3:-1]}.{arch[-1]}"
        gpus.append((str(i), name.value.decode(errors="replace"), cc))
    return gpus


def check_driver_and_gpus(ctx: _Context) -> list[Check]:
    rows = []
    want = WARNING  # no GPU never blocks a build: code compiles without one
    try:
        from opsmith._runtime import _driver
        major, minor = _driver.driver_version()
    except ImportError:
        return [Check("CUDA driver", WARNING, "check unavailable", "Upgrade opsmith.")]
    except (ToolchainError, OpsmithError) as exc:
        rows.append(Check("CUDA driver", want, "no usable NVIDIA driver: GPU code can be compiled here "
                          "but not run", _fix_of(exc)))
        return rows + [Check("GPUs", want, "none visible",
                             "Run on a machine with an NVIDIA GPU and driver (check nvidia-smi and "
                             "CUDA_VISIBLE_DEVICES).")]
    rows.append(Check("CUDA driver", OK, f"supports CUDA {major}.{minor}"))
    gpus = _nvidia_smi_gpus()
    if not gpus:
        try:
            gpus = _driver_gpus()
        except (OpsmithError, AttributeError, OSError):
            gpus = []
    if not gpus:
        rows.append(Check("GPUs", want, "none visible",
                          "Check nvidia-smi and CUDA_VISIBLE_DEVICES."))
    for idx, name, cc in gpus:
        ctx.gpu_archs.append("sm_" + cc.replace(".", ""))
        rows.append(Check(f"GPU {idx}", OK, f"{name}, compute capability {cc} (sm_{cc.replace('.', '')})"))
    return rows


def _arch_text(archs) -> str:
    return ", ".join(f"sm_{a.num}" + ("+PTX" if a.ptx else "") for a in archs)


def check_arch_list(ctx: _Context) -> list[Check]:
    from opsmith._config import settings
    text = settings.cuda_arch_list or ""
    try:
        from opsmith._toolchain._archs import parse_arch_list, resolve_archs
    except ImportError:
        return [Check("TORCH_CUDA_ARCH_LIST", WARNING, f"{text!r}: check unavailable "
                      f"(this opsmith has no arch module)", "Upgrade opsmith.")]
    versions = tuple(v for v in (getattr(ctx.nvcc, "version", None), ctx.torch_cuda) if v)
    try:
        if ctx.nvcc is not None:  # what a build would do: parsed, and checked against this nvcc
            archs = resolve_archs(text or None, nvcc_archs=tuple(ctx.nvcc.archs), cuda_versions=versions)
        elif text.strip() and text.strip() != "native":
            archs = parse_arch_list(text, gpus=[a[3:-1] + "." + a[-1] for a in ctx.gpu_archs],
                                    cuda_versions=versions)
        else:
            archs = None
    except ConfigError as exc:
        return [Check("TORCH_CUDA_ARCH_LIST", PROBLEM, f"{text!r} is invalid", _fix_of(exc))]
    if not text.strip():
        gpus = ", ".join(ctx.gpu_archs) if ctx.gpu_archs else "no GPU visible"
        shown = f": builds target {_arch_text(archs)}" if archs else ""
        return [Check("TORCH_CUDA_ARCH_LIST", OK, f"unset ({gpus}){shown}")]
    found = f"{text!r} -> {_arch_text(archs) if archs else text}"
    gpus = [a[3:-1] + "." + a[-1] for a in ctx.gpu_archs]
    try:
        from opsmith._toolchain._archs import _can_run
    except ImportError:
        _can_run = None
    if archs and gpus and _can_run is not None and not any(_can_run(a, g) for a in archs for g in gpus):
        return [Check("TORCH_CUDA_ARCH_LIST", WARNING, f"{found}: none of the GPUs here "
                      f"({', '.join(ctx.gpu_archs)}) can run that code ('no kernel image is available')",
                      f"Set TORCH_CUDA_ARCH_LIST={';'.join(sorted(set(gpus)))} (add it to the list to "
                      f"build for other machines too), or unset it to build for the GPUs here.")]
    return [Check("TORCH_CUDA_ARCH_LIST", OK, found)]
