"""Showing opsmith's errors to a person: rich on a terminal, plain text otherwise.

The exception's message is already complete (see ``_diagnostics``): the first error at the
user's line, a numbered excerpt with a caret, the command and the full log's path. Here it
is only laid out: the compiler command is shown when ``verbose`` (it is long and rarely what
one reads first), and on a terminal the error line, the marked source line and the caret are
highlighted. Compiler text is never parsed as rich markup (``[-Werror]`` stays as it is).
"""
from __future__ import annotations

import os
import sys
from typing import TextIO

from opsmith._errors import CompileError, OpsmithError

__all__ = ["error_lines", "render_error", "use_rich"]


def use_rich(stream: TextIO) -> bool:
    """True when ``stream`` is a terminal that is not ``TERM=dumb``."""
    if os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def error_lines(exc: BaseException, *, verbose: bool = False) -> list[str]:
    """The lines to show for ``exc``: its message, less the command unless ``verbose``."""
    lines = str(exc).splitlines() or [type(exc).__name__]
    if isinstance(exc, CompileError):
        kept = [ln for ln in lines if verbose or not ln.startswith("command: ")]
        if verbose and exc.command and not any(ln.startswith("command: ") for ln in lines):
            import shlex
            kept.append("command: " + shlex.join(exc.command))
        if not verbose and exc.command and len(kept) < len(lines):
            kept.append("(run with -v to see the compiler command)")
        lines = kept
    return lines


def render_error(exc: BaseException, stream: TextIO | None = None, *, verbose: bool = False,
                 rich: bool | None = None, prog: str = "opsmith") -> None:
    """Print ``exc`` for a person: ``opsmith: error: <first line>`` and the evidence below it."""
    stream = stream if stream is not None else sys.stderr
    lines = error_lines(exc, verbose=verbose)
    kind = type(exc).__name__ if isinstance(exc, OpsmithError) else "error"
    if rich is None:
        rich = use_rich(stream)
    if not rich:
        print(f"{prog}: error: {lines[0]}", file=stream)
        for ln in lines[1:]:
            print(ln, file=stream)
        return
    from rich.console import Console
    from rich.text import Text
    console = Console(file=stream, highlight=False, soft_wrap=True)
    head = Text()
    head.append(f"{prog}: ", style="bold")
    head.append(f"{kind}: ", style="bold red")
    head.append(lines[0], style="bold")
    console.print(head)
    for ln in lines[1:]:
        if ln.startswith("> "):
            console.print(Text(ln, style="bold"))
        elif ln.strip() == "^" or (ln.strip().endswith("^") and not ln.strip().strip("^")):
            console.print(Text(ln, style="bold red"))
        elif ln.startswith(("command: ", "full log: ", "(run with -v")):
            console.print(Text(ln, style="dim"))
        else:
            console.print(Text(ln))
