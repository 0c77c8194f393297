"""Showing the doctor's rows: the exit status, the JSON document and the table."""
from __future__ import annotations

import json
import sys
from typing import Any

from opsmith._version import __version__
from opsmith.cli._doctor import OK, PROBLEM, WARNING, Check

__all__ = ["exit_code", "to_json", "render"]


def exit_code(rows: list[Check]) -> int:
    """1 when something blocks builds (a problem row), else 0."""
    return 1 if any(r.status == PROBLEM for r in rows) else 0


def to_json(rows: list[Check]) -> str:
    doc: dict[str, Any] = {
        "opsmith": __version__, "ok": exit_code(rows) == 0,
        "problems": sum(r.status == PROBLEM for r in rows),
        "warnings": sum(r.status == WARNING for r in rows),
        "checks": [r.as_dict() for r in rows],
    }
    return json.dumps(doc, indent=2)


def _summary(rows: list[Check]) -> str:
    p = sum(r.status == PROBLEM for r in rows)
    w = sum(r.status == WARNING for r in rows)
    if p:
        return f"{p} problem{'s' * (p != 1)}, {w} warning{'s' * (w != 1)}: some builds will fail until fixed."
    if w:
        return f"no problems, {w} warning{'s' * (w != 1)}: builds work; see the warnings for what is unavailable."
    return "everything opsmith needs is in place."


def render(rows: list[Check], stream=None, *, rich: bool | None = None) -> None:
    """Print the table: with rich on a terminal, as aligned plain text otherwise."""
    from opsmith.cli._render import use_rich
    stream = stream if stream is not None else sys.stdout
    if rich is None:
        rich = use_rich(stream)
    if rich:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
        style = {OK: "green", WARNING: "yellow", PROBLEM: "bold red"}
        table = Table(title=f"opsmith {__version__} doctor", show_lines=False, expand=False)
        table.add_column("status", no_wrap=True)
        table.add_column("check", no_wrap=True, style="bold")
        table.add_column("found / fix", overflow="fold")
        for r in rows:  # Text, not markup: found/fix text may hold brackets ("[Errno 28]")
            text = Text(r.found)
            if r.fix:
                text.append("\nfix: ", style=style[r.status])
                text.append(r.fix)
            table.add_row(Text(r.status, style=style[r.status]), Text(r.name), text)
        console = Console(file=stream)
        console.print(table)
        console.print(_summary(rows))
        return
    width = max(len(r.name) for r in rows) if rows else 0
    print(f"opsmith {__version__} doctor", file=stream)
    for r in rows:
        print(f"  {r.status:<8} {r.name:<{width}}  {r.found}", file=stream)
        if r.fix:
            print(f"  {'':<8} {'':<{width}}  fix: {r.fix}", file=stream)
    print(_summary(rows), file=stream)
