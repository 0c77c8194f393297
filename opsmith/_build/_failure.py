"""A failed build as the error the user sees: which step failed, and the first real error at
the user's own file and line (inline sources mapped back to ``cpp_sources[i]``)."""
from __future__ import annotations

import os
from pathlib import Path

from opsmith._errors import CacheError, CompileError
from opsmith._spec import ExtensionSpec

__all__ = ["build_failure", "pch_rejected"]


def build_failure(spec: ExtensionSpec, result, steps, log_path: Path) -> CompileError | CacheError:
    from opsmith._build import _diagnostics

    step = result.failed_step
    output = result.failed_output or result.output
    if _diagnostics.disk_full(output, list(step.command) if step else []) is not None:
        # The disk, not the code: a CacheError that leads with the directory and its free space.
        return CacheError(str(_diagnostics.compile_error(output, command=list(step.command) if step else [],
                                                         sources={}, log_path=os.fspath(log_path))))
    sources = {}
    for s in spec.sources:
        text = s.text.decode(errors="replace")
        if s.path:
            sources[s.path] = text
            sources[s.display] = text
        else:
            # Inline sources carry `#line 1 "cpp_sources[i]"` markers: map each block back.
            for name, block in _split_inline(text):
                sources[name] = block
    if step is not None and step.label.startswith("link"):
        return _diagnostics.link_error(result.failed_output or result.output, command=list(step.command),
                                       log_path=os.fspath(log_path), with_cuda=spec.with_cuda)
    err = _diagnostics.compile_error(result.failed_output or result.output,
                                     command=list(step.command) if step else [],
                                     sources=sources, log_path=os.fspath(log_path),
                                     options=list(spec.extra_cflags), what=f"building {spec.name}")
    if spec.with_cuda:
        from opsmith._toolchain._nvcc import explain_failure
        fix = explain_failure(result.failed_output or result.output)
        if fix:
            err.args = (f"{err.args[0]}\nfix: {fix}",)
    return err


def pch_rejected(output: str, pch) -> bool:
    """Did the compiler refuse the PCH itself (rather than the user's code)?"""
    low = output.lower()
    return pch.key in output and any(w in low for w in (
        "malformed", "corrupt", "precompiled header", "pch file", "ast file", "invalid pch"))


def _split_inline(text: str):
    name, lines = None, []
    for line in text.splitlines():
        if line.startswith('#line 1 "') and line.endswith('"'):
            if name is not None:
                yield name, "\n".join(lines)
            name, lines = line[len('#line 1 "'):-1], []
        elif name is not None:
            lines.append(line)
    if name is not None:
        yield name, "\n".join(lines)

