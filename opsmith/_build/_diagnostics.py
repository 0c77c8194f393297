"""Turning compiler and linker output into errors that lead with the user's own line."""
from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
from collections.abc import Iterable, Mapping

from opsmith._errors import CompileError, LinkError

__all__ = ["Diagnostic", "first_error", "compile_error", "nvrtc_error", "link_error", "source_excerpt",
           "disk_full", "keep_for_rerun"]

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
    return _first(list(_errors(output)), user_files)


def _first(errors: list[Diagnostic], user_files: Iterable[str]) -> Diagnostic | None:
    user = set(user_files)
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
    full = disk_full(output, command)  # then nothing is copied: the disk is full
    command, kept = keep_for_rerun(command, log_path) if full is None else (command, None)
    if full is not None:
        return CompileError(_compose(full, "", command, log_path, kept), command=command, output=output,
                            options=options, log_path=log_path)
    diag = first_error(output, sources)
    if diag is None:
        tail = "\n".join(output.strip().splitlines()[-15:])
        head = f"{what} failed:\n{tail}" if tail else f"{what} failed with no output"
        return CompileError(_compose(head, "", command, log_path, kept), command=command, output=output,
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
    return CompileError(_compose(head, excerpt, command, log_path, kept), command=command, output=output,
                        source=diag.file, line=diag.line, options=options, log_path=log_path)


def _nvrtc_column(output: str, diag: Diagnostic) -> int | None:
    """NVRTC echoes the offending line indented by two spaces with a caret under the spot."""
    lines = output.splitlines()
    head = f"{diag.file}({diag.line}):"
    for i, line in enumerate(lines[:-2]):
        if line.startswith(head):
            caret = lines[i + 2]
            if caret.strip() == "^" and caret.index("^") >= 2:
                return caret.index("^") - 1
            return None
    return None


def nvrtc_error(output: str, *, name: str, source: str, options: list[str], hint: str = "") -> CompileError:
    """An NVRTC log as a CompileError, the same shape as a compiler's: the first error at the
    user's own file and line, the source around it with a caret, the real options.

    NVRTC runs in this process, so there is no command line to show: ``command`` stays empty
    and the message ends with the options NVRTC was given.
    """
    errors = [d for d in _errors(output) if d.file is not None]
    diag = _first(errors, [name])
    tail = f"NVRTC options: {' '.join(options)}"
    if diag is None or diag.file is None:
        return CompileError(f"NVRTC failed to compile {name}:\n{output.strip()}\n{tail}", output=output,
                            source=name, options=list(options))
    col = _nvrtc_column(output, diag)
    diag = dataclasses.replace(diag, col=col)
    excerpt = source_excerpt(source, diag.line, col) if diag.file == name else ""
    more = f"\n({len(errors) - 1} more error(s) in the full log: err.output)" if len(errors) > 1 else ""
    parts = [f"{diag.location()}: error: {diag.message}"] + ([excerpt] if excerpt else [])
    parts += [p for p in (hint.strip(), more.strip(), tail) if p]
    return CompileError("\n".join(parts), output=output, source=diag.file, line=diag.line,
                        options=list(options))


def link_error(output: str, *, command: list[str], log_path: str | None, with_cuda: bool) -> LinkError:
    full = disk_full(output, command)
    command, kept = keep_for_rerun(command, log_path) if full is None else (command, None)
    m = _UNDEF.search(output)
    if full is not None:
        head = full
    elif m:
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
    return LinkError(_compose(head, "", command, log_path, kept), command=command, output=output,
                     log_path=log_path)


def _compose(head: str, excerpt: str, command: list[str], log_path: str | None,
             kept: str | None = None) -> str:
    parts = [head]
    if excerpt:
        parts.append(excerpt)
    if command:
        parts.append("command: " + shlex.join(command))
        if kept:
            parts.append(f"(re-runnable as shown: the build directory is removed after a build, so "
                         f"the files it read from there were kept in {kept})")
    if log_path:
        parts.append(f"full log: {log_path}")
    return "\n".join(parts)


# -- a full disk -----------------------------------------------------------------------------------
_NOSPACE = "No space left on device"
# Where the compiler said it could not write: gcc `error writing to /tmp/ccX.s`, clang `error:
# unable to open output file '/x/y.o'`, `cannot write PCH file /x/y.gch`, ld `cannot open output file /x/y.so`.
_WRITE_PATH = re.compile(r"(?:writing to|output file|write PCH file|write to|open output file)\s+'?(/[^\s:']+)")


def _free_text(directory: str) -> str:
    try:
        usage = shutil.disk_usage(directory)
    except OSError:
        return "free space unknown"
    from opsmith._cache._admin import format_size
    return f"{format_size(usage.free)} free of {format_size(usage.total)}"


def disk_full(output: str, command: list[str]) -> str | None:
    """The message for a build that ran out of disk space, leading with the cause, or None.

    A compiler that cannot write often crashes (clang prints a backtrace first); the cause,
    ``No space left on device``, is further down. The message names the directory that
    filled, its free space, and a fix that can work there: pruning helps only when the cache
    holds a good part of that filesystem.
    """
    if _NOSPACE not in output:
        return None
    m = _WRITE_PATH.search(output)
    target = m.group(1) if m else _output_of(command)
    directory = os.path.dirname(target) if target else None
    while directory and not os.path.isdir(directory):
        directory = os.path.dirname(directory)
    where = directory or "the build directory"
    head = f"{_NOSPACE}: the build could not write into {where} ({_free_text(where) if directory else 'free space unknown'})."
    from opsmith._config import settings
    cache = os.fspath(settings.cache_path)
    tmp = os.environ.get("TMPDIR") or "/tmp"
    fixes = []
    in_cache = bool(directory) and os.path.realpath(directory).startswith(os.path.realpath(cache) + os.sep)
    if directory and not in_cache and _same_fs(directory, tmp):
        fixes.append(f"point TMPDIR at a directory on a disk with room (the compiler's temporary "
                     f"files go to {tmp})")
    else:
        fixes.append(f"set OPSMITH_CACHE_DIR to a directory on a disk with at least 2 GiB free "
                     f"(builds and their objects are written under the cache, now {cache})")
        used = _tree_bytes(cache)
        try:
            total = shutil.disk_usage(directory or cache).total
        except OSError:
            total = 0
        if total and used > total // 4:
            from opsmith._cache._admin import format_size
            fixes.append(f"or free space with `opsmith cache prune --max-size 1G` (the cache takes "
                         f"{format_size(used)})")
    return head + "\nfix: " + ", ".join(fixes) + "."


def _output_of(command: list[str]) -> str | None:
    for i, arg in enumerate(command[:-1]):
        if arg == "-o":
            return command[i + 1]
    return None


def _same_fs(a: str, b: str) -> bool:
    try:
        return os.stat(a).st_dev == os.stat(b).st_dev
    except OSError:
        return False


def _tree_bytes(root: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


# -- a command that can be run again -------------------------------------------------------------
def keep_for_rerun(command: list[str], log_path: str | None) -> tuple[list[str], str | None]:
    """Keep what a failed command read from its temporary build directory, and point it there.

    The build directory (the directory of the command's ``-o`` output) is removed when the
    build ends, so the ``command:`` line of an error would name files that are gone (an
    inline source, the objects of a link). The files the command names that lie in that
    directory are copied next to the log (``<log>.build/``, replaced by the next failure of
    the same build), and the command is rewritten to use that copy. Returns the command and
    the directory, or the command unchanged and None when there is nothing to keep.
    """
    out = _output_of(command)
    if not out or not log_path:
        return command, None
    build_dir = os.path.dirname(out)
    if not build_dir or not os.path.isdir(build_dir) or build_dir in ("/", os.path.dirname(log_path)):
        return command, None
    prefix = build_dir.rstrip("/") + "/"
    inputs = [a for a in command if a.startswith(prefix) and os.path.isfile(a)]
    keep = os.path.splitext(log_path)[0] + ".build"
    try:
        shutil.rmtree(keep, ignore_errors=True)
        os.makedirs(keep, mode=0o700, exist_ok=True)
        for a in inputs:
            dest = os.path.join(keep, a[len(prefix):])
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copy2(a, dest)
    except OSError:  # a full disk, most likely: the command stays as it ran
        shutil.rmtree(keep, ignore_errors=True)
        return command, None
    return [keep + "/" + a[len(prefix):] if a.startswith(prefix) else a.replace(prefix, keep + "/")
            for a in command], keep
