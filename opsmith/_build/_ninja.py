"""Running a set of build steps through ninja: parallel, logged, with progress and failure capture."""
from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from opsmith._toolchain._cxx import find_ninja

__all__ = ["Step", "NinjaResult", "run_steps"]

_STATUS = "@@opsmith[%f/%t] "


@dataclasses.dataclass(frozen=True)
class Step:
    """One command that makes ``output`` from ``inputs``; ``label`` names it in progress and errors."""

    output: str
    inputs: tuple[str, ...]
    command: tuple[str, ...]
    label: str
    depfile: bool = False


@dataclasses.dataclass
class NinjaResult:
    ok: bool
    output: str
    failed_step: Step | None = None
    failed_output: str = ""
    seconds: float = 0.0
    timings: tuple[tuple[str, float], ...] = ()  # (step label, seconds), from ninja's own log


def _timings(build_dir: Path, steps: list[Step]) -> tuple[tuple[str, float], ...]:
    """Each finished step's wall time, read from ``.ninja_log`` (``start_ms end_ms mtime output hash``)."""
    try:
        text = (build_dir / ".ninja_log").read_text(errors="replace")
    except OSError:
        return ()
    by_output = {s.output: s.label for s in steps}  # absolute paths, as ninja logs them
    last: dict[str, tuple[str, float]] = {}  # a step run twice in this build dir: its last run
    for line in text.splitlines():
        cols = line.split("\t")
        if len(cols) >= 4 and cols[0].isdigit() and cols[1].isdigit() and cols[3] in by_output:
            last.pop(cols[3], None)
            last[cols[3]] = (by_output[cols[3]], (int(cols[1]) - int(cols[0])) / 1000)
    return tuple(last.values())


def _esc_path(p: str) -> str:
    return p.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def _esc_value(s: str) -> str:
    return s.replace("$", "$$").replace("\n", " ")


def write_ninja(build_dir: Path, steps: list[Step]) -> Path:
    lines = ["ninja_required_version = 1.3", "",
             "rule run", "  command = $cmd", "  description = $desc", "",
             "rule run_dep", "  command = $cmd", "  description = $desc", "  depfile = $out.d", ""]
    for st in steps:
        rule = "run_dep" if st.depfile else "run"
        lines.append(f"build {_esc_path(st.output)}: {rule} " + " ".join(_esc_path(i) for i in st.inputs))
        lines.append(f"  cmd = {_esc_value(shlex.join(st.command))}")
        lines.append(f"  desc = {_esc_value(st.label)}")
    path = build_dir / "build.ninja"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_steps(build_dir: Path, steps: list[Step], *, jobs: int, log_path: Path,
              on_progress: Callable[[int, int, str], None] | None = None,
              on_line: Callable[[str], None] | None = None) -> NinjaResult:
    """Run ``steps`` with ninja in ``build_dir``; everything printed goes to ``log_path``."""
    write_ninja(build_dir, steps)
    env = dict(os.environ, NINJA_STATUS=_STATUS, LC_ALL="C")
    cmd = [find_ninja(), "-C", os.fspath(build_dir), "-j", str(max(1, jobs))]
    start = time.perf_counter()
    lines: list[str] = []
    with open(log_path, "w") as log:
        log.write("$ " + shlex.join(cmd) + "\n")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", env=env, cwd=build_dir)
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            line = line.rstrip("\n")
            lines.append(line)
            if line.startswith("@@opsmith["):
                head, _, desc = line.partition("] ")
                done, _, total = head[len("@@opsmith["):].partition("/")
                if on_progress and done.isdigit() and total.isdigit():
                    on_progress(int(done), int(total), desc)
            elif on_line:
                on_line(line)
        rc = proc.wait()
    seconds = time.perf_counter() - start
    output = "\n".join(lines)
    timings = _timings(build_dir, steps)
    if rc == 0:
        return NinjaResult(True, output, seconds=seconds, timings=timings)
    failed, failed_out = _failure(lines, steps)
    return NinjaResult(False, output, failed, failed_out, seconds, timings)


def _failure(lines: list[str], steps: list[Step]) -> tuple[Step | None, str]:
    by_output = {os.path.basename(s.output): s for s in steps}
    for i, line in enumerate(lines):
        if line.startswith("FAILED: "):
            outs = line[len("FAILED: "):].split()
            step = next((by_output.get(os.path.basename(o)) for o in outs
                         if os.path.basename(o) in by_output), None)
            body = []
            for nxt in lines[i + 2:]:  # skip the echoed command
                if nxt.startswith("@@opsmith[") or nxt.startswith("ninja: ") or nxt.startswith("FAILED: "):
                    break
                body.append(nxt)
            return step, "\n".join(body)
    return None, "\n".join(lines[-30:])
