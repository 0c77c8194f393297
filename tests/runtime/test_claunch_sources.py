"""The C launcher's sources (opsmith/_runtime/_claunch*.c, _claunch.h): every file setup.py
builds exists and is under the project's 400-line limit, each compiles alone as C99 with gcc and
clang against Python's headers (a missing compiler is skipped with the reason) at
``-Wall -Wextra -Werror``, and the built extension exports what the one-file version exported:
``PyInit__claunch`` and ``opsmith_claunch_noop``, nothing else."""
from __future__ import annotations

import ast
import importlib.util
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
RUNTIME = REPO / "opsmith" / "_runtime"
MAX_LINES = 400
EXPORTS = {"PyInit__claunch", "opsmith_claunch_noop"}


def _setup_paths() -> tuple[list[str], list[str]]:
    """(sources, depends) of the _claunch Extension, read from setup.py's syntax tree."""
    tree = ast.parse((REPO / "setup.py").read_text())
    names = {t.id: n.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
             for t in n.targets if isinstance(t, ast.Name)}
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "Extension" and \
                ast.literal_eval(call.args[0]) == "opsmith._runtime._claunch":
            def value(node):
                return ast.literal_eval(names[node.id] if isinstance(node, ast.Name) else node)
            kw = {k.arg: k.value for k in call.keywords}
            return value(call.args[1]), value(kw["depends"]) if "depends" in kw else []
    raise AssertionError("setup.py builds no opsmith._runtime._claunch Extension")


def test_setup_builds_every_claunch_file_and_each_is_short():
    sources, depends = _setup_paths()
    on_disk = sorted(p.relative_to(REPO).as_posix() for p in RUNTIME.glob("_claunch*.[ch]"))
    assert sorted(sources + depends) == on_disk
    assert all(s.endswith(".c") for s in sources) and all(d.endswith(".h") for d in depends)
    for rel in on_disk:
        n = len((REPO / rel).read_text().splitlines())
        assert n <= MAX_LINES, f"{rel} has {n} lines (the limit is {MAX_LINES}): split it by concept"


@pytest.mark.parametrize("compiler", [
    pytest.param(c, marks=pytest.mark.skipif(shutil.which(c) is None, reason=f"{c} is not installed"))
    for c in ("gcc", "clang")])
def test_each_source_compiles_alone(compiler, tmp_path):
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").is_file():
        pytest.skip(f"Python's headers are not installed (no {include}/Python.h)")
    sources, _ = _setup_paths()
    for rel in sources:
        proc = subprocess.run([compiler, "-std=c99", "-fPIC", "-Wall", "-Wextra", "-Werror", f"-I{include}",
                               "-c", str(REPO / rel), "-o", str(tmp_path / f"{Path(rel).stem}.o")],
                              capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, f"{compiler} rejected {rel}:\n{proc.stderr[-4000:]}"


def test_built_extension_exports_only_its_init_and_the_noop():
    spec = importlib.util.find_spec("opsmith._runtime._claunch")
    if spec is None or spec.origin is None:
        pytest.skip("the C launcher is not built (no C compiler at install)")
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run(["nm", "-D", "--defined-only", spec.origin], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert exported == EXPORTS, spec.origin
