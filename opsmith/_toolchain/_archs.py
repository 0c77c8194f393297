"""CUDA target archs: ``TORCH_CUDA_ARCH_LIST`` parsed as torch parses it, defaults, and nvcc flags.

``"8.0;9.0"``, ``"8.0 9.0"``, ``"9.0+PTX"``, ``"9.0a"``, named archs (``"Hopper"``,
``"Ampere"``...) and ``"native"`` mean what they mean to ``torch.utils.cpp_extension``. Unset,
the archs are the visible GPUs' (found once per boot and GPU set, remembered on disk, so a
warm load runs no CUDA query); with no GPU visible, a stated default with a warning. Several
archs give one fat binary (one ``-gencode`` pair each, one nvcc run).

A value that is really a CUDA version (``12.0`` put where a compute capability belongs: the
tutorial's ``nvcc fatal: Unsupported gpu architecture 'compute_120'``) is caught here, before
nvcc runs, with the fix.
"""
from __future__ import annotations

import collections
import functools
import logging
import re

from opsmith._config import on_reset as _on_reset
from opsmith._record import Record
from opsmith._errors import ConfigError

__all__ = ["Arch", "parse_arch_list", "gencode_flags", "resolve_archs", "visible_gpu_archs",
           "NAMED_ARCHS", "TORCH_SUPPORTED"]

log = logging.getLogger("opsmith.build")

# Exactly torch's table (torch/utils/cpp_extension.py, _get_cuda_arch_flags); combined names
# first, since expansion is textual replacement.
NAMED_ARCHS = collections.OrderedDict([
    ("Kepler+Tesla", "3.7"),
    ("Kepler", "3.5+PTX"),
    ("Maxwell+Tegra", "5.3"),
    ("Maxwell", "5.0;5.2+PTX"),
    ("Pascal", "6.0;6.1+PTX"),
    ("Volta+Tegra", "7.2"),
    ("Volta", "7.0+PTX"),
    ("Turing", "7.5+PTX"),
    ("Ampere+Tegra", "8.7"),
    ("Ampere", "8.0;8.6+PTX"),
    ("Ada", "8.9+PTX"),
    ("Hopper", "9.0+PTX"),
    ("Blackwell+Tegra", "11.0"),
    ("Blackwell", "10.0;10.3;12.0;12.1+PTX"),
])
TORCH_SUPPORTED = ("3.5", "3.7", "5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0",
                   "8.6", "8.7", "8.9", "9.0", "9.0a", "10.0", "10.0a", "11.0", "11.0a", "10.3",
                   "10.3a", "12.0", "12.0a", "12.1", "12.1a")
_GPU_NAMES = {"7.0": "V100", "7.5": "T4 / RTX 20xx", "8.0": "A100", "8.6": "RTX 30xx / A10",
              "8.7": "Jetson Orin", "8.9": "L4 / L40 / RTX 40xx", "9.0": "H100 / H200",
              "10.0": "B200 / GB200", "10.3": "B300", "12.0": "RTX 50xx / RTX PRO 6000",
              "12.1": "DGX Spark"}
_RECORD_NS = "toolchain"


class Arch(Record):
    """One target: compute capability ``major.minor`` (``suffix`` ``"a"`` for 9.0a), ``ptx``: also embed PTX."""

    __slots__ = ("major", "minor", "suffix", "ptx")

    @property
    def cc(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}"

    @property
    def num(self) -> str:
        return f"{self.major}{self.minor}{self.suffix}"

    def __str__(self) -> str:
        return self.cc + ("+PTX" if self.ptx else "")


def _fix_text(gpus: list[str]) -> str:
    if gpus:
        return (f"the GPU(s) here are compute capability {', '.join(sorted(set(gpus)))}: set "
                f"TORCH_CUDA_ARCH_LIST={';'.join(sorted(set(gpus)))} or unset it (opsmith then builds for the "
                f"visible GPUs)")
    return ("set it to your GPU's compute capability (e.g. 8.0 for A100, 9.0 for H100, 12.0 for RTX 50xx; "
            "`nvidia-smi --query-gpu=compute_cap --format=csv`) or unset it")


def parse_arch_list(text: str, *, gpus: list[str] | None = None,
                    cuda_versions: tuple[str, ...] = ()) -> tuple[Arch, ...]:
    """Parse a ``TORCH_CUDA_ARCH_LIST`` value the way torch does.

    Parameters
    ----------
    text : str
        ``"8.0;9.0"``, ``"8.0 9.0+PTX"``, ``"Hopper"``...
    gpus : list of str, optional
        The visible GPUs' compute capabilities, for the error message.
    cuda_versions : tuple of str
        The toolkit's and torch's CUDA versions (``"12.8"``): an entry equal to one of these
        that is no compute capability is named as a CUDA version in the error.

    Examples
    --------
    >>> [str(a) for a in parse_arch_list("Ampere;9.0+PTX")]
    ['8.0', '8.6+PTX', '9.0+PTX']
    """
    raw = text.strip().replace(" ", ";")
    for name, value in NAMED_ARCHS.items():
        raw = raw.replace(name, value)
    out: list[Arch] = []
    for item in raw.split(";"):
        item = item.strip()
        if not item:
            continue
        m = re.fullmatch(r"(\d+)\.(\d+)(a?)(\+PTX)?", item)
        if m is None or f"{m[1]}.{m[2]}{m[3]}" not in TORCH_SUPPORTED:
            hint = ""
            base = item.split("+")[0]
            if base in cuda_versions or re.fullmatch(r"1[1-3]\.\d+", base):
                hint = (f" {base!r} looks like a CUDA version, not a GPU compute capability. "
                        f"TORCH_CUDA_ARCH_LIST takes compute capabilities: " + _fix_text(gpus or []) + ".")
            else:
                fix = _fix_text(gpus or [])
                hint = " " + fix[:1].upper() + fix[1:] + "."  # not .capitalize(): it lowers "A100", "GPU's"
            raise ConfigError(
                f"TORCH_CUDA_ARCH_LIST={text!r}: {item!r} is not a CUDA arch torch knows "
                f"(known: {', '.join(TORCH_SUPPORTED)}, each optionally +PTX, or the names "
                f"{', '.join(NAMED_ARCHS)}).{hint}")
        arch = Arch(int(m[1]), int(m[2]), m[3], bool(m[4]))
        if arch not in out:
            out.append(arch)
    if not out:
        raise ConfigError(f"TORCH_CUDA_ARCH_LIST={text!r} names no arch: {_fix_text(gpus or [])}.")
    return tuple(out)


def gencode_flags(archs) -> list[str]:
    """nvcc flags for ``archs``: one fat binary with SASS for each, plus PTX where asked.

    Examples
    --------
    >>> gencode_flags(parse_arch_list("8.0;9.0+PTX"))
    ['-gencode=arch=compute_80,code=sm_80', '-gencode=arch=compute_90,code=compute_90', '-gencode=arch=compute_90,code=sm_90']
    """
    flags = set()
    for a in archs:
        flags.add(f"-gencode=arch=compute_{a.num},code=sm_{a.num}")
        if a.ptx:
            flags.add(f"-gencode=arch=compute_{a.num},code=compute_{a.num}")
    return sorted(flags)


def _can_run(arch: Arch, gpu: str) -> bool:
    """Whether code built for ``arch`` runs on a GPU of compute capability ``gpu`` ("9.0")."""
    major, minor = (int(x) for x in gpu.split("."))
    if arch.suffix:  # arch-specific features: that exact chip only
        return (arch.major, arch.minor) == (major, minor)
    if arch.ptx:
        return (arch.major, arch.minor) <= (major, minor)
    return arch.major == major and arch.minor <= minor


def visible_gpu_archs(state=None) -> list[str]:
    """Compute capabilities of the visible GPUs (``["9.0"]``), clamped to what torch supports.

    Asked of torch once per boot and GPU set, then remembered in the machine-local state; in a process
    where torch has already initialised CUDA, asked directly (that is cheap there).
    """
    import sys
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch.cuda, "is_initialized", lambda: False)():
        return _query_torch()
    from opsmith._toolchain._gpus import gpu_fingerprint  # one identity of the GPU set, shared with the warm index
    return _visible_cached(gpu_fingerprint(), state)


@functools.lru_cache(maxsize=8)
def _visible_cached(fingerprint: str, state) -> list[str]:
    from opsmith._cache._state import memo
    doc = memo(state, _RECORD_NS, "gpus-" + fingerprint, lambda: {"archs": _query_torch()},
               valid=lambda d: isinstance(d["archs"], list))
    return list(doc["archs"])


def _query_torch() -> list[str]:
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    supported = [int("".join(re.findall(r"\d+", a.split("_")[1]))) for a in torch.cuda.get_arch_list()
                 if a.startswith("sm_")]
    top = max(((s // 10, s % 10) for s in supported), default=None)
    out = []
    for i in range(torch.cuda.device_count()):
        cap = tuple(torch.cuda.get_device_capability(i))
        if top is not None:
            cap = min(top, cap)  # as torch: a newer GPU than torch knows gets torch's newest arch
        s = f"{cap[0]}.{cap[1]}"
        if s not in out:
            out.append(s)
    return sorted(out, key=lambda s: tuple(int(x) for x in s.split(".")))


@functools.lru_cache(maxsize=32)
def _default_warned(text: str) -> None:
    log.warning("%s", text)


def resolve_archs(arch_list: str | None, *, nvcc_archs: tuple[str, ...], cuda_versions: tuple[str, ...],
                  state=None) -> tuple[Arch, ...]:
    """The archs to build for: the setting, else the visible GPUs', else a stated default.

    ``nvcc_archs`` are the compute capabilities the nvcc in use can build (``"9.0"``...); an
    arch outside them is an error here, with the fix, instead of ``nvcc fatal`` later.
    """
    if arch_list and arch_list.strip() != "native":
        archs = parse_arch_list(arch_list, gpus=visible_gpu_archs(state), cuda_versions=cuda_versions)
        _check_against_nvcc(arch_list, archs, nvcc_archs, cuda_versions, state)
        gpus = visible_gpu_archs(state)
        if gpus and not any(_can_run(a, g) for a in archs for g in gpus):
            looks_like_version = all(a.cc in cuda_versions or re.fullmatch(r"1[1-3]\.\d", a.cc) for a in archs)
            msg = (f"TORCH_CUDA_ARCH_LIST={arch_list!r} builds code that none of the GPUs here "
                   f"(compute capability {', '.join(gpus)}) can run: loading it would fail with "
                   f"'no kernel image is available for execution on the device'.")
            if looks_like_version:
                raise ConfigError(msg + f" {arch_list!r} is also a CUDA version: TORCH_CUDA_ARCH_LIST takes "
                                  f"GPU compute capabilities, not CUDA versions. Fix: " + _fix_text(gpus) + ".")
            _default_warned(msg + " Building anyway (for other machines?); add the local GPU's arch to run it here.")
        return archs
    gpus = visible_gpu_archs(state)
    usable = [g for g in gpus if not nvcc_archs or g in nvcc_archs]
    if usable:
        archs = [Arch(*map(int, g.split(".")), "", False) for g in usable]
        # as torch: the newest also gets PTX, so a newer GPU can still JIT-compile it
        archs[-1] = archs[-1]._replace(ptx=True)
        return tuple(archs)
    if gpus:
        top = max(nvcc_archs, key=lambda s: tuple(int(x) for x in s.split("."))) if nvcc_archs else "9.0"
        _default_warned(f"the GPU(s) here (compute capability {', '.join(gpus)}) are newer than this nvcc "
                        f"can build for; building {top}+PTX (JIT-compiled by the driver at load). Install a "
                        f"newer CUDA toolkit to build for them directly.")
        return (Arch(*map(int, top.split(".")), "", True),)
    default = _no_gpu_default(nvcc_archs)
    _default_warned(f"no CUDA GPU visible and TORCH_CUDA_ARCH_LIST is unset: building for {default} "
                    f"(PTX that the driver compiles for any newer GPU at first load). Set "
                    f"TORCH_CUDA_ARCH_LIST to your GPUs' compute capabilities (e.g. '8.0;9.0') for "
                    f"ready-made code for them.")
    return (default,)


def _no_gpu_default(nvcc_archs: tuple[str, ...]) -> Arch:
    """The oldest arch that both torch and this nvcc support, with PTX: it runs on every newer GPU."""
    candidates = [c for c in TORCH_SUPPORTED if not c.endswith("a") and (not nvcc_archs or c in nvcc_archs)
                  and tuple(int(x) for x in c.split(".")) >= (7, 5)]
    cc = min(candidates, key=lambda s: tuple(int(x) for x in s.split("."))) if candidates else "7.5"
    return Arch(*map(int, cc.split(".")), "", True)


def _check_against_nvcc(text, archs, nvcc_archs, cuda_versions, state) -> None:
    if not nvcc_archs:
        return
    missing = [a for a in archs if f"{a.major}.{a.minor}" not in nvcc_archs]
    if not missing:
        return
    gpus = visible_gpu_archs(state)
    nvcc_ver = cuda_versions[0] if cuda_versions else "?"
    names = ", ".join(f"{a.cc} (sm_{a.num}{', ' + _GPU_NAMES[a.cc] if a.cc in _GPU_NAMES else ''})"
                      for a in missing)
    lo, hi = nvcc_archs[0], nvcc_archs[-1]
    msg = (f"TORCH_CUDA_ARCH_LIST={text!r} asks for compute capability {names}, which this nvcc "
           f"(CUDA {nvcc_ver}) cannot build: it builds {lo} to {hi} (nvcc would stop with "
           f"\"Unsupported gpu architecture 'compute_{missing[0].num}'\").")
    if any(a.cc in cuda_versions or re.fullmatch(r"1[1-3]\.\d", a.cc) for a in missing):
        msg += (" If you meant a CUDA version: TORCH_CUDA_ARCH_LIST takes GPU compute capabilities, "
                "not CUDA versions. Fix: " + _fix_text(gpus) + ".")
    msg += " If you do target that GPU, install a CUDA toolkit that supports it and point CUDA_HOME at it."
    raise ConfigError(msg)


@_on_reset
def _forget() -> None:
    _visible_cached.cache_clear()
