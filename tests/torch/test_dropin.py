"""Drop-in without surprises (issue 11): signatures, flags, messages, small CLI fixes.

Fast tests: no torch header is compiled here (tests/torch/test_dropin_e2e.py has the end-to-end ones).
"""
from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
import sys
import types

import pytest

torch = pytest.importorskip("torch")
import opsmith  # noqa: E402
from opsmith._errors import CompileError, SpecError, ToolchainError  # noqa: E402
from opsmith._spec import ExtensionSpec  # noqa: E402


# -- item 3: torch's signatures, SYCL refused ------------------------------------------------------
def _params(fn):
    return [p.name for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", ["load", "load_inline"])
def test_parameters_are_torchs_in_torchs_order(name):
    import torch.utils.cpp_extension as tce
    ours, theirs = _params(getattr(opsmith, name)), _params(getattr(tce, name))
    assert ours[:len(theirs)] == theirs  # opsmith's additions (is_standalone) only after torch's


def test_sycl_sources_is_the_fourth_positional_and_is_refused():
    with pytest.raises(SpecError, match="SYCL is not supported"):
        opsmith.load_inline("x", "int f();", None, "sycl code")
    with pytest.raises(SpecError, match="SYCL is not supported"):
        opsmith.load("x", ["a.sycl"])
    with pytest.raises(SpecError, match="pass it by name"):  # torch < 2.8's positional extra_ldflags
        opsmith.load("x", ["a.cpp"], None, None, ["-lm"])
    with pytest.raises(SpecError, match="SYCL"):
        opsmith.build_inline("x", "int f();", with_sycl=True)


def test_sycl_parameters_left_empty_are_accepted(tmp_path):
    # Empty SYCL arguments pass the check and reach the spec (which then refuses the missing file).
    with pytest.raises(SpecError, match="does not exist"):
        opsmith.load("x", [str(tmp_path / "missing.cpp")], extra_sycl_cflags=[], with_sycl=False)


def test_setuptools_sycl_extension_is_refused():
    from opsmith.setuptools import SyclExtension
    with pytest.raises(SpecError, match="SYCL is not supported"):
        SyclExtension("x", ["x.sycl"])


def test_setuptools_has_every_public_name_of_torchs_module():
    import torch.utils.cpp_extension as tce
    import opsmith.setuptools as ours
    names = set(tce.__all__) | {n for n in dir(tce) if n.isupper() and not n.startswith("_")}
    for n in sorted(names):
        if n in ("SyclExtension", "CUDA_HOME"):
            continue
        getattr(ours, n)  # no AttributeError
    assert ours.load is opsmith.load and ours.load_inline is opsmith.load_inline
    assert ours.IS_HIP_EXTENSION is tce.IS_HIP_EXTENSION and ours.TORCH_LIB_PATH == tce.TORCH_LIB_PATH
    with pytest.raises(AttributeError):
        ours.no_such_name  # noqa: B018


def test_setuptools_cuda_home_is_where_opsmith_finds_nvcc(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    import opsmith.setuptools as ours
    ours.__dict__.pop("CUDA_HOME", None)
    assert ours._cuda_home() == str(tmp_path)
    monkeypatch.delenv("CUDA_HOME")
    monkeypatch.setenv("CUDACXX", str(tmp_path / "no-nvcc"))  # opsmith finds none: None, as torch
    assert ours._cuda_home() is None


# -- item 4: lenient flags ---------------------------------------------------------------------------
def test_flags_are_stripped_and_split_as_torch_does():
    spec = ExtensionSpec.from_inline(
        "x", "int f() { return 1; }", kind="module", extra_cflags=["-g\n\n", "-O0 -Wall", "  "],
        extra_cuda_cflags=[" -lineinfo "], extra_ldflags=["-lm -ldl"],
        extra_include_paths=["   dir\n"])
    assert spec.extra_cflags == ("-g", "-O0", "-Wall")
    assert spec.extra_cuda_cflags == ("-lineinfo",)
    assert spec.extra_ldflags == ("-lm", "-ldl")
    assert spec.extra_include_paths == (os.path.abspath("dir"),)
    # one word is kept as given (a quoted macro value stays a string literal)
    spec = ExtensionSpec.from_inline("x", "int f();", kind="module", extra_cflags=['-DNAME="v"'])
    assert spec.extra_cflags == ('-DNAME="v"',)


def test_lenient_flags_build_for_real(tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "answer.h").write_text("#define ANSWER 42\n")
    path = opsmith.load_inline("lenient", '#include "answer.h"\nextern "C" int answer() { return ANSWER; }',
                               extra_cflags=["-g\n\n", "-O0 -Wall"], extra_include_paths=[f"   {inc}\n"],
                               is_python_module=False, no_implicit_headers=True)
    import ctypes
    assert ctypes.CDLL(path).answer() == 42


# -- item 6: is_standalone with build_directory --------------------------------------------------------
def test_standalone_executable_lands_in_build_directory(tmp_path):
    src = tmp_path / "main.cpp"
    src.write_text('#include <cstdio>\nint main() { std::puts("hi"); return 0; }\n')
    bdir = tmp_path / "build"
    bdir.mkdir()
    exe = opsmith.load("tool", [str(src)], build_directory=str(bdir), is_python_module=False,
                       is_standalone=True)
    assert exe == os.path.join(str(bdir), "tool")  # where torch's callers look
    assert subprocess.run([exe], capture_output=True, text=True, check=True).stdout == "hi\n"
    again = opsmith.load("tool", [str(src)], build_directory=str(bdir), is_python_module=False,
                         is_standalone=True)  # the warm path places it too
    assert again == exe and os.access(again, os.X_OK)


# -- item 11: functions= checked before compiling; a command that can be re-run --------------------------
def test_functions_naming_an_undefined_function_fails_before_compiling(monkeypatch):
    import opsmith._build._engine as engine
    monkeypatch.setattr(engine, "build_spec", lambda spec: pytest.fail("compiled"))
    with pytest.raises(SpecError, match=r"'relu_fw'.*did you mean 'relu_fwd'"):
        opsmith.load_inline("x", "torch::Tensor relu_fwd(torch::Tensor x) { return x; }",
                            functions=["relu_fw"])
    with pytest.raises(SpecError, match="'nope'"):
        opsmith.load_inline("x", "torch::Tensor a(torch::Tensor x);", functions={"a": "doc", "nope": "doc"})


def test_functions_declared_in_cpp_and_defined_in_cuda_pass_the_check():
    spec = ExtensionSpec.from_inline("x", "torch::Tensor relu(torch::Tensor x);", "// cuda", ["relu"],
                                     kind="module", with_cuda=True)
    assert b"m.def(\"relu\"" in spec.sources[0].text


def test_compile_error_command_can_be_rerun(tmp_path):
    with pytest.raises(CompileError) as info:
        opsmith.build_inline("broken", "int f() { return }", is_python_module=False, no_implicit_headers=True)
    err = info.value
    assert "re-runnable as shown" in str(err)
    src = next(a for a in err.command if a.endswith("main.cpp"))
    assert os.path.isfile(src)  # kept, though the build directory is gone
    rerun = subprocess.run(err.command, capture_output=True, text=True)
    assert rerun.returncode != 0 and "error" in rerun.stderr  # the same error again, not "file not found"
    assert "no such file" not in rerun.stderr.lower()


# -- item 7: a full disk ---------------------------------------------------------------------------------
CLANG_CRASH = """PLEASE submit a bug report to https://github.com/llvm/llvm-project/issues/
Stack dump:
0.	Program arguments: /usr/bin/clang++ -c main.cpp -o {out}
 #0 0x00007f llvm::sys::PrintStackTrace(llvm::raw_ostream&, int)
 #1 0x00007f llvm::sys::RunSignalHandlers()
fatal error: error in backend: IO failure on output stream: No space left on device
clang: error: clang frontend command failed with exit code 70 (use -v to see invocation)
"""


def test_full_disk_leads_with_the_cause_the_directory_and_its_free_space(tmp_path, fresh_cache):
    from opsmith._build import _diagnostics
    out = fresh_cache / "tmp" / "build-x" / "main.o"  # where builds run: under the cache
    out.parent.mkdir(parents=True)
    err = _diagnostics.compile_error(CLANG_CRASH.format(out=out), command=["clang++", "-c", "m.cpp", "-o", str(out)],
                                     sources={}, log_path=str(tmp_path / "x.log"))
    first = str(err).splitlines()[0]
    assert first.startswith("No space left on device: the build could not write into ")
    assert str(out.parent) in first and " free of " in first
    assert "OPSMITH_CACHE_DIR" in str(err) and "prune" not in str(err)  # an empty cache: pruning cannot help
    gcc = "cc1plus: fatal error: error writing to /tmp/ccAbc.s: No space left on device"
    msg = _diagnostics.disk_full(gcc, ["g++", "-c", "a.cpp", "-o", str(out)])
    assert msg.startswith("No space left on device: the build could not write into /tmp ")
    assert "TMPDIR" in msg or "OPSMITH_CACHE_DIR" in msg
    assert _diagnostics.disk_full("a.cpp:1:1: error: x", []) is None


# -- item 9: CUDA sources against a CPU-only torch ---------------------------------------------------------
@pytest.mark.skipif(bool(torch.version.cuda), reason="needs a CPU-only torch")
def test_cuda_sources_with_cpu_only_torch_are_refused_by_default(monkeypatch):
    from opsmith._toolchain import _nvcc
    monkeypatch.setattr(_nvcc, "find_nvcc", lambda *a, **k: pytest.fail("looked for nvcc first"))
    with pytest.raises(ToolchainError, match=r"CPU-only build.*whl/cu\d+.*OPSMITH_CUDA_WITH_CPU_TORCH=1"):
        opsmith.build_inline("cudaop", "void f();", cuda_sources="void f() {}", is_python_module=False,
                             no_implicit_headers=True)


@pytest.mark.skipif(bool(torch.version.cuda), reason="needs a CPU-only torch")
def test_cuda_with_cpu_torch_setting_builds_anyway(monkeypatch):
    from opsmith._toolchain import _nvcc
    monkeypatch.setenv("OPSMITH_CUDA_WITH_CPU_TORCH", "1")
    sentinel = ToolchainError("nvcc looked up: the CPU-torch check let the build through")
    monkeypatch.setattr(_nvcc, "find_nvcc", lambda *a, **k: (_ for _ in ()).throw(sentinel))
    with pytest.raises(ToolchainError, match="let the build through"):
        opsmith.build_inline("cudaop", "void f();", cuda_sources="void f() {}", is_python_module=False,
                             no_implicit_headers=True)


# -- item 10: NVRTC and kernels without a usable CUDA torch --------------------------------------------------
def _nvrtc_or_skip():
    try:
        from cuda.bindings import nvrtc  # noqa: F401
    except ImportError:
        pytest.skip("cuda-bindings (NVRTC) is not installed")


def test_nvrtc_arch_error_gives_the_supported_range():
    _nvrtc_or_skip()
    from opsmith._build._nvrtc import compile_cuda
    with pytest.raises(CompileError, match=r"NVRTC cannot compile kernel.cu for sm_30: this NVRTC supports sm_\d+ to sm_\d+"):
        compile_cuda('extern "C" __global__ void k(float* x) {}', arch="sm_30")


def test_ptx_reports_the_virtual_arch():
    _nvrtc_or_skip()
    from opsmith._build._nvrtc import compile_cuda
    b = compile_cuda('extern "C" __global__ void k(float* x) {}', arch="compute_90", output="ptx")
    assert b.arch == "compute_90"
    assert compile_cuda('extern "C" __global__ void k(float* x) {}', arch="compute_90", output="ptx").arch == "compute_90"


@pytest.mark.skipif(bool(torch.version.cuda), reason="needs a CPU-only torch")
def test_kernel_without_cuda_torch_is_a_toolchain_error():
    _nvrtc_or_skip()
    k = opsmith.cuda_kernel('extern "C" __global__ void k(float* x, int n) {}', "k", arch="sm_90")
    for use in (lambda: k.attributes, lambda: k.launch_n(4, torch.ones(4), 4), lambda: k.occupancy(128)):
        with pytest.raises(ToolchainError, match="CUDA"):
            use()


# -- item 12: smaller ones --------------------------------------------------------------------------------------
def test_progress_does_not_say_link_after_a_failed_compile():
    from opsmith._build._progress import Progress
    p = Progress("building x")
    p.begin_steps(2)
    p.step(1, 3, "compile a.cpp")
    p.step(2, 3, "compile b.cpp")  # ninja prints the failed step's status first...
    p.line("FAILED: /tmp/b.o")     # ...then FAILED
    p.step(3, 3, "compile c.cpp")
    assert "link" not in p.phase and "failed" in p.phase
    p.close()


def test_progress_note_stays_on_the_line():
    from opsmith._build._progress import Progress
    p = Progress("building x")
    p.note("torch headers will be precompiled after this build")
    p.step(1, 2, "compile a.cpp")
    assert "after this build" in str(p._text()) and "link" in str(p._text())
    p.close()


@pytest.mark.parametrize("argv", [["cache", "prune"], ["cache", "prune", "--max-size", "10X"],
                                  ["cache", "prune", "--older-than", "soon"]])
def test_prune_usage_errors_exit_2(argv, capsys):
    from opsmith.cli import main
    assert main(argv) == 2
    assert "error:" in capsys.readouterr().err


def test_doctor_cuda_hint_matches_nvcc():
    from opsmith.cli import _doctor, _doctor_cuda
    ctx = _doctor._Context()
    ctx.torch_cuda = None
    rows = _doctor_cuda._cuda_versions(ctx, types.SimpleNamespace(version="13.0"))
    assert "whl/cu130" in rows[0].fix and "cu128" not in rows[0].fix
    assert _doctor_cuda._torch_index("12.8").endswith("/cu128")


def test_arch_hint_keeps_its_capitals():
    from opsmith._errors import ConfigError
    from opsmith._toolchain._archs import parse_arch_list
    with pytest.raises(ConfigError) as info:
        parse_arch_list("7.7")
    msg = str(info.value)
    assert "Set it to your GPU's compute capability" in msg and "A100" in msg and "RTX 50xx" in msg


def test_demo_fresh_removes_its_cache(monkeypatch):
    from opsmith.cli import _demo
    seen = {}

    def fake(env, fresh):
        seen.update(env=env, fresh=fresh)
        os.makedirs(os.path.join(env["OPSMITH_CACHE_DIR"], "entries", "x"))
        return 0
    monkeypatch.setattr(_demo, "_run_demo", fake)
    assert _demo.run_demo(fresh=True) == 0
    assert seen["fresh"] and seen["env"]["OPSMITH_PCH"] == "0"
    assert not os.path.exists(seen["env"]["OPSMITH_CACHE_DIR"])


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python >= 3.11's")
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_pyproject_license_form_matches_the_build_requirement():
    """setuptools >= 77 deprecates the ``license = {text = ...}`` table (a boxed warning at each
    build, an error from 2027-02-18) and older ones refuse the SPDX string that replaces it: the
    string goes with a build requirement of setuptools>=77."""
    meta = _pyproject()
    license_ = meta["project"]["license"]
    assert isinstance(license_, str), f'license = "BSD-3-Clause" (an SPDX expression), not {license_!r}'
    (req,) = [r for r in meta["build-system"]["requires"] if r.startswith("setuptools")]
    pin = re.fullmatch(r"setuptools\s*>=\s*(\d+)(\.[\d.]+)?", req)
    assert pin and int(pin.group(1)) >= 77, f"the SPDX license string needs setuptools>=77, not {req!r}"


def test_building_the_metadata_prints_no_warning(tmp_path):
    """pip's first step in setup.sh's `pip install -e .`: setuptools' metadata hook, run on a copy
    of the project (nothing is written into the checkout)."""
    import setuptools
    meta = _pyproject()
    (req,) = [r for r in meta["build-system"]["requires"] if r.startswith("setuptools")]
    need = int(re.search(r"\d+", req).group())
    if int(setuptools.__version__.split(".")[0]) < need:
        pytest.skip(f"setuptools {setuptools.__version__} is older than the build requirement {req!r} "
                    "(pip's isolated build installs a newer one)")
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    project = tmp_path / "project"
    shutil.copytree(os.path.join(root, "opsmith"), project / "opsmith",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(os.path.join(root, name), project / name)
    (tmp_path / "out").mkdir()
    hook = ("import sys\nfrom setuptools import build_meta\n"
            "print(build_meta.prepare_metadata_for_build_editable(sys.argv[1]))")
    proc = subprocess.run([sys.executable, "-W", "default", "-c", hook, str(tmp_path / "out")], cwd=project,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = proc.stdout + proc.stderr
    warnings = [ln for ln in said.splitlines() if re.search(r"warn|deprecat", ln, re.IGNORECASE)]
    assert not warnings, said[-3000:]
    dist_info = proc.stdout.strip().splitlines()[-1]
    metadata = (tmp_path / "out" / dist_info / "METADATA").read_text()
    assert "License-Expression: BSD-3-Clause" in metadata
    assert "Requires-Dist: numpy" in metadata  # torch warns at every import without it


def test_numpy_is_a_dependency():
    """torch prints "Failed to initialize NumPy: No module named 'numpy'" at import without it
    (the first line a new user saw from `opsmith demo`), and Tensor.numpy() fails."""
    deps = [re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0] for d in _pyproject()["project"]["dependencies"]]
    assert "numpy" in deps, deps


def test_readme_use_it_snippets_name_files_that_exist():
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    readme = open(os.path.join(root, "README.md")).read()
    use = readme.split("## Use it", 1)[1].split("\n## ", 1)[0]
    import re
    for path in re.findall(r'"(examples/[^"]+)"', use):
        assert os.path.isfile(os.path.join(root, path)), path
    assert "examples/" in use


# -- item 13: the background PCH build on few cores -----------------------------------------------------------
def test_background_pch_waits_for_the_foreground_build_on_few_cores(monkeypatch, fresh_cache):
    from opsmith._build import _pch
    from opsmith._cache._open import open_cache
    cache = open_cache()
    started = []
    monkeypatch.setattr(_pch, "_cores_to_spare", lambda: False)
    monkeypatch.setattr(_pch, "subprocess", types.SimpleNamespace(
        Popen=lambda cmd, **kw: started.append(cmd), DEVNULL=subprocess.DEVNULL, STDOUT=subprocess.STDOUT))
    notes = []
    compiler = types.SimpleNamespace(path="/usr/bin/clang++", family="clang", fingerprint="fp")
    tinfo = types.SimpleNamespace(fingerprint="t")
    assert _pch.ensure_pch(cache, compiler, tinfo, ["-DX"], on_note=notes.append, wait=False) is None
    assert notes and "after this build" in notes[0] and "after this process exits" in notes[0]
    import json
    job = json.loads(started[0][-1])
    gate = job["gate"]
    probe = [sys.executable, "-c", f"import filelock,sys; l=filelock.FileLock({gate!r});\n"
             f"try:\n l.acquire(timeout=0); print('free')\nexcept filelock.Timeout: print('held')"]
    assert subprocess.run(probe, capture_output=True, text=True).stdout.strip() == "held"
    _pch.release_foreground()
    assert subprocess.run(probe, capture_output=True, text=True).stdout.strip() == "free"


def test_background_pch_starts_at_once_with_cores_to_spare(monkeypatch, fresh_cache):
    from opsmith._build import _pch
    from opsmith._cache._open import open_cache
    started = []
    monkeypatch.setattr(_pch, "_cores_to_spare", lambda: True)
    monkeypatch.setattr(_pch, "subprocess", types.SimpleNamespace(
        Popen=lambda cmd, **kw: started.append(cmd), DEVNULL=subprocess.DEVNULL, STDOUT=subprocess.STDOUT))
    compiler = types.SimpleNamespace(path="/usr/bin/clang++", family="clang", fingerprint="fp")
    _pch.ensure_pch(open_cache(), compiler, types.SimpleNamespace(fingerprint="t"), ["-DY"], wait=False)
    import json
    assert "gate" not in json.loads(started[0][-1])


def test_cache_stats_says_what_the_precompiled_headers_take(fresh_cache, capsys, tmp_path):
    from opsmith._cache._open import open_cache
    from opsmith.cli import main
    f = tmp_path / "torch.pch"
    f.write_bytes(b"p" * 3000)
    open_cache().store.put("k" * 32, {"torch.pch": f}, kind="pch", name="torch/extension.h", move=True)
    assert main(["cache", "stats"]) == 0
    out = capsys.readouterr().out
    assert "precompiled headers:" in out and "100% of the cache" in out
