"""The doctor's row (:class:`Check`), the context its checks share, and their small helpers."""
from __future__ import annotations

import dataclasses
import os
import subprocess

__all__ = ["OK", "PROBLEM", "WARNING", "Check", "CUDA_EXTRA"]

OK, WARNING, PROBLEM = "ok", "warning", "problem"
_LOW_SPACE = 1 << 30       # below this, a warning: a CUDA extension's objects take hundreds of MB
_NO_SPACE = 64 << 20       # below this, a problem: a torch PCH alone is ~100-400 MB
CUDA_EXTRA = "pip install 'opsmith[cuda]'"


@dataclasses.dataclass(frozen=True)
class Check:
    """One row of the doctor's table.

    Attributes
    ----------
    name : str
        What was checked ("ninja", "cache directory", ...).
    status : str
        ``"ok"``, ``"warning"`` or ``"problem"``.
    found : str
        What was found, in one line.
    fix : str
        How to fix it, one line (empty for ok rows).
    """

    name: str
    status: str
    found: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


class _Context:
    """What one check learns that a later one needs (torch's CUDA version, the compiler, GPUs)."""

    def __init__(self) -> None:
        self.torch_cuda: str | None = None
        self.torch_ok = False
        self.cxx = None
        self.nvcc = None
        self.gpu_archs: list[str] = []


def _fix_of(exc: BaseException) -> str:
    """Our errors say what is wrong and then how to fix it; the whole message is the fix line."""
    return " ".join(str(exc).split())


def _run(cmd: list[str], timeout: float = 30) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, LC_ALL="C"))
    except (OSError, subprocess.TimeoutExpired):
        return None
