"""Turning compiler and linker output into errors that lead with the user's own line."""
from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Iterable, Mapping

from opsmith._errors import CompileError, LinkError

__all__ = ["Diagnostic", "first_error", "compile_error", "link_error", "source_excerpt"]

# gcc/clang:  file:line:col: error: msg      nvcc/cudafe:  file(line): error: msg
_GCC = re.compile(r"^(?P<file>[^\s:][^:\n]*):(?P<line>\d+):(?:(?P<col>\d+):)?\s*(?:fatal )?error:\s*(?P<msg>.*)$")
_NVCC = re.compile(r"^(?P<file>[^\s(][^(\n]*)\((?P<line>\d+)\):\s*(?:catastrophic )?error:?\s*(?P<msg>.*)$")
_TOOL = re.compile(r"^(?P<tool>\S*(?:g\+\+|gcc|clang\+\+|clang|c\+\+|nvcc|cc1plus|ld|collect2)):\s*(?:fatal )?error:\s*(?P<msg>.*)$")
_UNDEF = re.compile(r"undefined (?:reference|symbol)(?: to)?:?\s*[`'\"]?(?P<sym>[^`'\"\n]+)[`'\"]?")


@dataclasses.dataclass(frozen=True)
class Diagnostic:
    file: str | None
    line: int | None
    col: int | None
    message: str

    def location(self) -> str:
        if self.file is None:
            return ""
        loc = f"{self.file}:{self.line}"
        return loc + (f":{self.col}" if self.col else "")


def _errors(output: str) -> Iterable[Diagnostic]:
    for raw in output.splitlines():
        line = raw.rstrip()
        m = _GCC.match(line) or _NVCC.match(line)
        if m:
            col = m.groupdict().get("col")
            yield Diagnostic(m["file"], int(m["line"]), int(col) if col else None, m["msg"].strip())
            continue
        m = _TOOL.match(line)
        if m:
            yield Diagnostic(None, None, None, f"{m['tool'].rsplit('/', 1)[-1]}: {m['msg'].strip()}")


def first_error(output: str, user_files: Iterable[str] = ()) -> Diagnostic | None:
    """The first error in a user file if there is one, else the first error at all."""
    user = set(user_files)
    errors = list(_errors(output))
    for d in errors:
        if d.file is not None and (d.file in user or any(d.file.endswith("/" + u) for u in user)):
            return d
    return errors[0] if errors else None


def source_excerpt(text: str, line: int, col: int | None, context: int = 2) -> str:
    """A few numbered lines around ``line`` with a caret under ``col``."""
    lines = text.splitlines()
    if not 1 <= line <= len(lines):
        return ""
    out = []
    width = len(str(min(len(lines), line + context)))
    for n in range(max(1, line - context), min(len(lines), line + context) + 1):
        mark = ">" if n == line else " "
        out.append(f"{mark} {n:>{width}} | {lines[n - 1]}")
        if n == line and col:
            out.append(" " * (width + 5) + " " * (col - 1) + "^")
    return "\n".join(out)


def compile_error(output: str, *, command: list[str], sources: Mapping[str, str],
                  log_path: str | None, options: list[str] | None = None,
                  what: str = "compilation") -> CompileError:
    """A CompileError for ``output``; ``sources`` maps names errors use -> source text."""
    diag = first_error(output, sources)
    if diag is None:
        tail = "\n".join(output.strip().splitlines()[-15:])
        head = f"{what} failed:\n{tail}" if tail else f"{what} failed with no output"
        return CompileError(_compose(head, "", command, log_path), command=command, output=output,
                            options=options, log_path=log_path)
    head = f"{diag.location()}: error: {diag.message}" if diag.file else diag.message
    excerpt = ""
    if diag.file and diag.line:
        text = sources.get(diag.file)
        if text is None:
            text = next((t for name, t in sources.items() if diag.file.endswith("/" + name)), None)
        if text is None:
            try:
                with open(diag.file, errors="replace") as f:
                    text = f.read()
            except OSError:
                text = None
        if text is not None:
            excerpt = source_excerpt(text, diag.line, diag.col)
    return CompileError(_compose(head, excerpt, command, log_path), command=command, output=output,
                        source=diag.file, line=diag.line, options=options, log_path=log_path)


def link_error(output: str, *, command: list[str], log_path: str | None, with_cuda: bool) -> LinkError:
    m = _UNDEF.search(output)
    if m:
        sym = m["sym"].strip()
        head = f"link failed: undefined symbol `{sym}`."
        hint = ("It is declared but no source defines it: check its spelling and signature against "
                "the definition, that the file defining it is in `sources`")
        hint += (", and that the CUDA source defining it is compiled (a .cu file, with_cuda)."
                 if with_cuda or ".cu" in output else ", and add the library that defines it to "
                 "extra_ldflags (-lNAME).")
        head += "\n" + hint
    else:
        diag = first_error(output)
        head = "link failed: " + (diag.message if diag else "\n".join(output.strip().splitlines()[-10:]))
    return LinkError(_compose(head, "", command, log_path), command=command, output=output,
                     log_path=log_path)


def _compose(head: str, excerpt: str, command: list[str], log_path: str | None) -> str:
    parts = [head]
    if excerpt:
        parts.append(excerpt)
    if command:
        parts.append("command: " + shlex.join(command))
    if log_path:
        parts.append(f"full log: {log_path}")
    return "\n".join(parts)
