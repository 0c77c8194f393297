"""End-to-end drop-in checks (issue 11): real compiler, real processes.

The modules here are written against Python's C API only (no torch headers), so that each
build takes a fraction of a second; they still link torch's libraries (libc10, libtorch),
which is what a warm load before ``import torch`` must cope with.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

# A Python module that reports how it was compiled: NDEBUG (asserts off) and __OPTIMIZE__ (-O1+).
C_API_MODULE = r'''
#include <Python.h>
static PyObject* ndebug(PyObject*, PyObject*) {
#ifdef NDEBUG
  Py_RETURN_TRUE;
#else
  Py_RETURN_FALSE;
#endif
}
static PyObject* optimized(PyObject*, PyObject*) {
#ifdef __OPTIMIZE__
  Py_RETURN_TRUE;
#else
  Py_RETURN_FALSE;
#endif
}
static PyMethodDef methods[] = {{"ndebug", ndebug, METH_NOARGS, ""},
                                {"optimized", optimized, METH_NOARGS, ""},
                                {nullptr, nullptr, 0, nullptr}};
static PyModuleDef def = {PyModuleDef_HEAD_INIT, "MODNAME", nullptr, -1, methods};
extern "C" PyObject* PyInit_MODNAME() { return PyModule_Create(&def); }
'''


def _module_source(tmp_path: Path, name: str) -> Path:
    src = tmp_path / f"{name}.cpp"
    src.write_text(C_API_MODULE.replace("MODNAME", name))
    return src


def _env(cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSMITH_")}
    env["OPSMITH_CACHE_DIR"] = str(cache)
    env.pop("LD_LIBRARY_PATH", None)  # torch's lib dir must not be found by any other route
    return env


WARM_SCRIPT = '''
import sys
from opsmith import load                     # as a project's JIT script: opsmith first
m = load("warmmod", [{src!r}], extra_ldflags=["-Wl,--no-as-needed"])
print("torch-imported-by-load", "torch" in sys.modules)
print("build-modules-imported", "opsmith._build._engine" in sys.modules)
import torch                                 # ... and torch later
print("ndebug", m.ndebug())
'''


def test_warm_load_in_a_process_that_has_not_imported_torch(fresh_cache, tmp_path):
    src = _module_source(tmp_path, "warmmod")
    script = WARM_SCRIPT.format(src=str(src))
    env = _env(fresh_cache)
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert "build-modules-imported True" in first.stdout  # the cold run built it
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr  # was: libc10.so: cannot open shared object file
    assert "build-modules-imported False" in second.stdout  # answered by the warm index
    assert "torch-imported-by-load True" in second.stdout
    # the module really needs torch's libraries, or this test would prove nothing
    so = next(Path(fresh_cache, "entries").glob("*/warmmod.so"))
    needed = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True).stdout
    assert "libc10.so" in needed


SETUP_PY = '''
from setuptools import setup
from opsmith.setuptools import (CppExtension, CUDAExtension, BuildExtension, CUDA_HOME,
                                include_paths, library_paths, ROCM_HOME, IS_HIP_EXTENSION,
                                TORCH_LIB_PATH, get_default_build_root)

import os
print("cuda_home", CUDA_HOME is None or os.path.isfile(os.path.join(CUDA_HOME, "bin", "nvcc")))
ext = CppExtension  # C++ only: this test must not depend on a CUDA build of torch
print("names", callable(include_paths), callable(library_paths), ROCM_HOME is None or isinstance(ROCM_HOME, str),
      IS_HIP_EXTENSION in (True, False), bool(TORCH_LIB_PATH), bool(get_default_build_root()))
setup(name="aotmod", ext_modules=[ext("aotmod", ["aotmod.cpp"], extra_link_args=["-Wl,--no-as-needed"])],
      cmdclass={"build_ext": BuildExtension})
'''


def test_setup_py_importing_cuda_home_builds_optimised_without_asserts(fresh_cache, tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    _module_source(proj, "aotmod")
    (proj / "setup.py").write_text(SETUP_PY)
    env = _env(fresh_cache)
    p = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=proj, env=env,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "names True True True True True True" in p.stdout
    assert "cuda_home True" in p.stdout
    assert "opsmith: built aotmod" in p.stdout
    check = subprocess.run([sys.executable, "-c", textwrap.dedent('''
        import torch, aotmod
        print("ndebug", aotmod.ndebug(), "optimized", aotmod.optimized())
    ''')], cwd=proj, env=env, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    # torch's BuildExtension keeps Python's -DNDEBUG -O3 for C++ sources; so must we
    assert "ndebug True optimized True" in check.stdout


def test_setup_py_user_flags_still_win(fresh_cache, tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    _module_source(proj, "dbgmod")
    (proj / "setup.py").write_text(textwrap.dedent('''
        from setuptools import setup
        from opsmith.setuptools import CppExtension, BuildExtension
        setup(name="dbgmod", ext_modules=[CppExtension("dbgmod", ["dbgmod.cpp"],
              extra_compile_args={"cxx": ["-O0", "-UNDEBUG"]})], cmdclass={"build_ext": BuildExtension})
    '''))
    env = _env(fresh_cache)
    p = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=proj, env=env,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    check = subprocess.run([sys.executable, "-c", "import torch, dbgmod; print(dbgmod.ndebug(), dbgmod.optimized())"],
                           cwd=proj, env=env, capture_output=True, text=True)
    assert check.stdout.split() == ["False", "False"], check.stderr
