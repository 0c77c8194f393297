"""The exceptions opsmith raises. Each one says what went wrong and how to fix it."""
from __future__ import annotations

__all__ = [
    "OpsmithError", "SpecError", "ConfigError", "ToolchainError", "CompileError", "LinkError",
    "CacheError", "LaunchError",
]


class OpsmithError(Exception):
    """Base class of every error opsmith raises on purpose."""


class SpecError(OpsmithError, ValueError):
    """The request itself is wrong (no sources, a missing file, a bad name or flag)."""


class ConfigError(OpsmithError, ValueError):
    """A setting or environment variable has a value opsmith cannot use."""


class ToolchainError(OpsmithError, RuntimeError):
    """A compiler, ninja, a header set or a library that a build needs is missing or unusable."""


class CacheError(OpsmithError, RuntimeError):
    """The cache directory or one of its entries cannot be used safely."""


class LaunchError(OpsmithError, ValueError):
    """A kernel launch was refused before it reached the GPU (bad argument, grid or device)."""


class CompileError(OpsmithError, RuntimeError):
    """A compiler (or linker) rejected the code.

    The message leads with the first error at the user's own file and line. The attributes
    carry the evidence: ``command`` (list of str), ``output`` (the compiler's full output),
    ``source`` (the file or inline-source name of the first error), ``line``, ``options``
    and ``log_path`` (the full log on disk, or None).
    """

    def __init__(self, message: str, *, command: list[str] | None = None, output: str = "",
                 source: str | None = None, line: int | None = None,
                 options: list[str] | None = None, log_path: str | None = None) -> None:
        super().__init__(message)
        self.command = list(command or [])
        self.output = output
        self.source = source
        self.line = line
        self.options = list(options or [])
        self.log_path = log_path

    def __reduce__(self):  # keep the attributes across pickling (multiprocessing, ray)
        return (_rebuild_compile_error, (type(self), str(self), self.__dict__.copy()))


class LinkError(CompileError):
    """The linker failed: an undefined or duplicate symbol, a missing library."""


def _rebuild_compile_error(cls, message, state):
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.__dict__.update(state)
    return err
