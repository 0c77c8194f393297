"""The arrows between opsmith's packages, as docs/architecture.md draws them, checked on the code.

Every ``import`` statement of every module is read (module level and inside functions: a lazy
import is still an arrow), resolved to an absolute module name and checked against the rules.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "opsmith"
BASE = {"opsmith._errors", "opsmith._config", "opsmith._record", "opsmith._version"}

# (package or module prefix, forbidden import prefixes, why)
RULES = [
    ("opsmith._cache", ("opsmith._build", "opsmith._toolchain", "opsmith._torch", "opsmith._runtime",
                        "opsmith.ops", "opsmith.onnx", "opsmith.setuptools", "torch"),
     "the cache knows no compiler and no torch"),
    ("opsmith._runtime", ("opsmith._build", "opsmith._toolchain", "opsmith.ops", "opsmith.export_c", "opsmith.onnx"),
     "the runtime never compiles, and the core knows no target"),
    ("opsmith._toolchain", ("opsmith._build", "opsmith._torch", "opsmith._runtime", "opsmith.ops"),
     "the toolchain knows neither build, torch integration nor runtime"),
    ("opsmith._build", ("opsmith._torch", "opsmith.ops", "opsmith.setuptools", "opsmith.export_c", "opsmith.onnx",
                        "opsmith.package"),
     "the build engine and its profiles know no torch integration and no target"),
    ("opsmith._spec", ("opsmith._build", "opsmith._torch", "opsmith._runtime", "opsmith._cache"),
     "a spec is a value: it builds and loads nothing"),
    ("opsmith.compile_cache", ("opsmith._torch", "opsmith._build", "opsmith._toolchain", "opsmith._runtime",
                               "opsmith.ops", "opsmith.onnx", "opsmith.export_c", "opsmith.setuptools"),
     "a target uses the core (cache, config, errors), never another target"),
    ("opsmith.onnx", ("opsmith._torch", "opsmith.ops", "opsmith.export_c", "opsmith.compile_cache",
                      "opsmith.setuptools", "opsmith.cli"),
     "the ONNX Runtime target reads op descriptions (opsmith._opdesc) and the core, never another target"),
    ("opsmith.export_c", ("opsmith._torch", "opsmith.ops", "opsmith.onnx", "opsmith._onnx", "opsmith.compile_cache",
                          "opsmith.setuptools", "opsmith.cli"),
     "the export-c target uses the core (launch unit, launch core, engine), never another target"),
    ("opsmith.package", ("opsmith._torch", "opsmith.ops", "opsmith.onnx", "opsmith.export_c", "opsmith.compile_cache",
                         "opsmith.setuptools", "opsmith.cli"),
     "the package target uses the core (NVRTC, prebuilt binaries, signing); what a module compiles comes from "
     "the torch target through a process (python -m opsmith._torch._package_record), never an import"),
]


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def _imports(name: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            for a in node.names:  # `from opsmith._cache import _store` imports opsmith._cache._store
                found.add(f"{mod}.{a.name}")
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module" \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            found.add(node.args[0].value)
    return found


def _under(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


def test_forbidden_arrows():
    bad = []
    for name, path in _modules():
        imports = _imports(name, path)
        for owner, forbidden, why in RULES:
            if not _under(name, owner):
                continue
            for imp in imports:
                if any(_under(imp, f) for f in forbidden):
                    bad.append(f"{name} imports {imp}: {why}")
        if not _under(name, "opsmith.cli") and name != "opsmith.__main__":
            bad += [f"{name} imports {imp}: nothing imports the CLI" for imp in imports if _under(imp, "opsmith.cli")]
        if name in BASE:
            bad += [f"{name} imports {imp}: the base modules import only the standard library"
                    for imp in imports if imp.split(".")[0] not in sys.stdlib_module_names
                    and not any(_under(imp, b) for b in BASE) and imp != "opsmith"]
        if name == "opsmith._opdesc":  # plain data that every target reads
            bad += [f"{name} imports {imp}: op descriptions import the standard library, _record and _errors only"
                    for imp in imports if imp.split(".")[0] not in sys.stdlib_module_names
                    and imp not in ("opsmith", "opsmith._record", "opsmith._errors")
                    and not imp.startswith(("opsmith._record.", "opsmith._errors."))]
    assert not bad, "forbidden imports:\n" + "\n".join(sorted(set(bad)))


def test_the_rules_catch_an_arrow(tmp_path):
    """The checker itself: a runtime module importing the build is reported."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from opsmith._build._nvrtc import compile_cuda\n")
    imports = _imports("opsmith._runtime.m", f)
    assert "opsmith._build._nvrtc" in imports


@pytest.mark.parametrize("pkg", ["_cache", "_toolchain", "_build", "_runtime", "_torch", "export_c"])
def test_each_package_says_what_it_owns(pkg):
    assert ast.get_docstring(ast.parse((PKG / pkg / "__init__.py").read_text()))


def test_warm_load_imports_only_these_modules(tmp_path):
    """A warm ``load`` (answered by the warm index) imports no build, toolchain or compiler code."""
    src = tmp_path / "lib.cpp"
    src.write_text('extern "C" int answer() { return 42; }\n')
    env = dict(os.environ, OPSMITH_CACHE_DIR=str(tmp_path / "cache"))
    code = ("import sys, json, opsmith\n"
            f"p = opsmith.load('warmmods', [{str(src)!r}], is_python_module=False, is_standalone=False)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('opsmith'))))\n")
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    allowed = {"opsmith", "opsmith._config", "opsmith._errors", "opsmith._record", "opsmith._version",
               "opsmith._torch", "opsmith._torch._extension", "opsmith._torch._warm",
               "opsmith._cache", "opsmith._cache._stamps", "opsmith._cache._state", "opsmith._cache._store",
               "opsmith._cache._open", "opsmith._cache._local", "opsmith._cache._keys", "opsmith._cache._root",
               "opsmith._toolchain", "opsmith._toolchain._gpus", "opsmith._spec",
               # torch's autoload of opsmith's entry point at `import torch`: reads one setting
               "opsmith.compile_cache", "opsmith.compile_cache._autoload"}
    assert loaded <= allowed, f"a warm load imported {sorted(loaded - allowed)}"
    assert not any(m.startswith(("opsmith._build", "opsmith._toolchain._cxx", "opsmith._toolchain._nvcc")) for m in loaded)
    assert "opsmith._cache._locks" not in loaded and "opsmith._cache._workspace" not in loaded  # made on first use


# -- targets, circles, size ----------------------------------------------------------------------
# A target turns kernels into one kind of product; targets share the core, never each other.
TARGETS = {
    "torch": ("opsmith._torch", "opsmith.ops", "opsmith.setuptools"),
    "onnxruntime": ("opsmith.onnx",),
    "export-c": ("opsmith.export_c",),
    "compile-cache": ("opsmith.compile_cache",),
    "package": ("opsmith.package",),
}
MAX_LINES = 400


def _target_of(mod: str) -> str | None:
    for target, prefixes in TARGETS.items():
        if any(_under(mod, p) for p in prefixes):
            return target
    return None


def test_no_target_imports_another():
    bad = []
    for name, path in _modules():
        mine = _target_of(name)
        if mine is None:
            continue
        for imp in _imports(name, path):
            theirs = _target_of(imp)
            if theirs is not None and theirs != mine:
                bad.append(f"{name} ({mine}) imports {imp} ({theirs}): a target uses the core, never another target")
    assert not bad, "\n".join(sorted(set(bad)))


def _graph() -> dict[str, set[str]]:
    """Module -> the opsmith modules it imports (module level and inside functions), without the
    edges to its own parent packages (Python runs a package's __init__ before any submodule)."""
    mods = dict(_modules())
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        graph[name] = {imp for imp in _imports(name, path)
                       if imp in mods and imp != name and imp not in parents}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    circles = _circles(_graph())
    assert not circles, "import circles (function-level imports count):\n" + "\n".join(
        " <-> ".join(c) for c in circles)


def test_the_circle_check_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_module_over_the_line_limit():
    long = [f"{path.relative_to(PKG.parent)}: {n} lines"
            for path in sorted(PKG.rglob("*")) if path.suffix in (".py", ".c", ".h", ".cpp", ".cu", ".cuh")
            and (n := len(path.read_text().splitlines())) > MAX_LINES]
    assert not long, f"modules over {MAX_LINES} lines (one concept per module: split them):\n" + "\n".join(long)


# Cross-cutting tests stay at the top; every other test lives in the folder of the package it tests.
TOP_LEVEL_TESTS = {"test_architecture.py", "test_docs.py", "test_opdesc.py"}


def test_tests_mirror_the_packages():
    tests = PKG.parent / "tests"
    stray = sorted(p.name for p in tests.glob("test_*.py") if p.name not in TOP_LEVEL_TESTS)
    orphans = sorted(f"tests/{d.name}/" for d in tests.iterdir() if d.is_dir() and any(d.glob("test_*.py"))
                     and not ((PKG / d.name).is_dir() or (PKG / f"_{d.name}").is_dir()))
    assert not stray, f"tests at the top of tests/ ({stray}): move each into tests/<package>/"
    assert not orphans, f"test folders that name no package of opsmith/: {orphans}"


def test_the_default_run_recurses_into_every_test_folder(pytestconfig):
    """No folder under tests/ matches a ``norecursedirs`` pattern: pytest's default pattern ``build`` had left
    tests/build's 117 tests out of every run not given that folder by name."""
    import fnmatch
    tests = Path(__file__).resolve().parent
    patterns = pytestconfig.getini("norecursedirs")
    folders = [d for d in tests.rglob("*") if d.is_dir() and d.name != "__pycache__" and any(d.glob("test_*.py"))]
    assert folders and not [(d.name, p) for d in folders for p in patterns if fnmatch.fnmatch(d.name, p)]
