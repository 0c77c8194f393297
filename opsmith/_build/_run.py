"""Running one compiler or linker command outside ninja, with the failure as a CompileError."""
from __future__ import annotations

import logging
import os
import subprocess

from opsmith._errors import CompileError, ToolchainError

__all__ = ["run_tool"]

log = logging.getLogger("opsmith.build")


def run_tool(cmd: list[str], source, what: str) -> None:
    """Run ``cmd``; a failure raises :class:`CompileError` leading with the first error line.

    ``what`` names the thing being built in the message ("the exported library").
    """
    log.info("%s", " ".join(cmd))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise ToolchainError(f"could not run {cmd[0]}: {exc.strerror}") from None
    if proc.returncode != 0:
        output = proc.stdout + proc.stderr
        first = next((ln for ln in output.splitlines() if "error" in ln), output.strip()[:500])
        raise CompileError(f"building {what} failed: {first}\ncommand: {' '.join(cmd)}",
                           command=cmd, output=output, source=os.fspath(source))
