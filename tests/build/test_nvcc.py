"""nvcc builds without a GPU: arch parsing and flags, nvcc found as a user's would be, a .cu
compiled to an object, and the error texts (nvcc missing, CUDA_HOME wrong, unsupported
arch, a kernel compile error at the user's line, a link error).

Tests that run nvcc need one: from CUDA_HOME, PATH, /usr/local/cuda or the pip wheel
(``pip install nvidia-cuda-nvcc nvidia-cuda-cccl``); they skip, saying so, only without one.
"""
from __future__ import annotations

import os
import subprocess

import pytest

from opsmith._torch._profile import TorchExtension

from opsmith._toolchain import _archs
from opsmith._toolchain._archs import Arch, gencode_flags, parse_arch_list, resolve_archs
from opsmith._errors import CompileError, ConfigError, LinkError, ToolchainError

torch = pytest.importorskip("torch")
import opsmith  # noqa: E402


def _nvcc_or_skip():
    from opsmith._toolchain._nvcc import locate_nvcc
    try:
        return locate_nvcc()[0]
    except ToolchainError as exc:
        pytest.skip(f"no nvcc here ({str(exc)[:80]}...): pip install nvidia-cuda-nvcc nvidia-cuda-cccl")


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(_archs, "visible_gpu_archs", lambda state=None: [])


# --- TORCH_CUDA_ARCH_LIST ---------------------------------------------------------------------

def test_arch_list_separators_ptx_and_suffix():
    assert [str(a) for a in parse_arch_list("8.0;9.0")] == ["8.0", "9.0"]
    assert [str(a) for a in parse_arch_list("8.0 8.6 9.0+PTX")] == ["8.0", "8.6", "9.0+PTX"]
    assert parse_arch_list("9.0a") == (Arch(9, 0, "a", False),)
    assert parse_arch_list("10.0") == (Arch(10, 0, "", False),)


def test_named_archs_expand_as_torch():
    assert [str(a) for a in parse_arch_list("Hopper")] == ["9.0+PTX"]
    assert [str(a) for a in parse_arch_list("Ampere;Hopper")] == ["8.0", "8.6+PTX", "9.0+PTX"]
    assert [str(a) for a in parse_arch_list("Maxwell+Tegra")] == ["5.3"]
    assert [str(a) for a in parse_arch_list("Blackwell")] == ["10.0", "10.3", "12.0", "12.1+PTX"]


def test_gencode_flags_match_torch():
    assert gencode_flags(parse_arch_list("9.0+PTX")) == [
        "-gencode=arch=compute_90,code=compute_90", "-gencode=arch=compute_90,code=sm_90"]
    assert gencode_flags(parse_arch_list("8.0;9.0a")) == [
        "-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90a,code=sm_90a"]
    # torch's own function agrees where it can be called without a GPU
    from torch.utils.cpp_extension import _get_cuda_arch_flags
    os.environ["TORCH_CUDA_ARCH_LIST"] = "7.5;8.0;9.0+PTX"
    try:
        assert sorted(_get_cuda_arch_flags()) == gencode_flags(parse_arch_list("7.5;8.0;9.0+PTX"))
    finally:
        del os.environ["TORCH_CUDA_ARCH_LIST"]


def test_unknown_arch_and_cuda_version_mistaken_for_an_arch():
    with pytest.raises(ConfigError, match=r"'12\.8' looks like a CUDA version"):
        parse_arch_list("12.8", cuda_versions=("12.8",))
    with pytest.raises(ConfigError, match="not a CUDA arch torch knows"):
        parse_arch_list("sm_90")
    with pytest.raises(ConfigError, match="names no arch"):
        parse_arch_list(" ; ")


def test_tutorial_12_0_with_an_old_nvcc_is_caught_before_nvcc(monkeypatch):
    # The tutorial: CUDA 12.0's nvcc (no compute_120) and TORCH_CUDA_ARCH_LIST=12.0.
    monkeypatch.setattr(_archs, "visible_gpu_archs", lambda state=None: ["9.0"])
    old_nvcc = ("5.0", "6.0", "7.0", "7.5", "8.0", "8.6", "8.9", "9.0")
    with pytest.raises(ConfigError) as ei:
        resolve_archs("12.0", nvcc_archs=old_nvcc, cuda_versions=("12.0", "12.8"))
    msg = str(ei.value)
    assert "compute_120" in msg and "not CUDA versions" in msg and "TORCH_CUDA_ARCH_LIST=9.0" in msg


def test_12_0_that_no_gpu_here_can_run_is_an_error_with_the_fix(monkeypatch):
    monkeypatch.setattr(_archs, "visible_gpu_archs", lambda state=None: ["9.0"])
    new_nvcc = ("7.5", "8.0", "9.0", "10.0", "12.0")
    with pytest.raises(ConfigError, match="CUDA version.*TORCH_CUDA_ARCH_LIST=9.0"):
        resolve_archs("12.0", nvcc_archs=new_nvcc, cuda_versions=("13.0",))
    # cross-compiling on purpose still works (with a warning) when the list is no CUDA version
    assert resolve_archs("8.0", nvcc_archs=new_nvcc, cuda_versions=("13.0",)) == (Arch(8, 0, "", False),)


def test_default_archs_visible_gpus_else_stated_default(monkeypatch, caplog):
    monkeypatch.setattr(_archs, "visible_gpu_archs", lambda state=None: ["8.0", "9.0"])
    assert [str(a) for a in resolve_archs(None, nvcc_archs=("7.5", "8.0", "9.0"), cuda_versions=())] == [
        "8.0", "9.0+PTX"]
    monkeypatch.setattr(_archs, "visible_gpu_archs", lambda state=None: [])
    _archs._default_warned.cache_clear()
    with caplog.at_level("WARNING", logger="opsmith"):
        archs = resolve_archs(None, nvcc_archs=("7.5", "8.0", "9.0"), cuda_versions=())
    assert [str(a) for a in archs] == ["7.5+PTX"]
    assert "no CUDA GPU visible" in caplog.text


def test_unsupported_arch_for_this_nvcc(no_gpu):
    with pytest.raises(ConfigError, match=r"cannot build.*compute_35"):
        resolve_archs("3.5", nvcc_archs=("7.5", "8.0", "9.0"), cuda_versions=("13.0",))


# --- finding nvcc and its errors ----------------------------------------------------------------

def test_cuda_home_wrong_is_a_clear_error(cache_dir_env, tmp_path, monkeypatch):
    from opsmith._toolchain._nvcc import locate_nvcc
    monkeypatch.delenv("CUDACXX", raising=False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nope"))
    with pytest.raises(ToolchainError, match=r"CUDA_HOME=.*has no nvcc.*does not exist.*toolkit root"):
        locate_nvcc()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "nvcc").chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "bin"))
    with pytest.raises(ToolchainError, match=r"looks like the bin directory: set CUDA_HOME="):
        locate_nvcc()


def test_nvcc_missing_is_a_clear_error(tmp_path, monkeypatch):
    from opsmith._toolchain import _nvcc
    for v in ("CUDA_HOME", "CUDA_PATH", "CUDACXX"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(_nvcc, "_DEFAULT_HOMES", ())
    monkeypatch.setattr(_nvcc, "_pip_nvccs", lambda: [])
    with pytest.raises(ToolchainError, match=r"nvcc \(the CUDA compiler\) was not found.*CUDA_HOME"):
        _nvcc.locate_nvcc()
    src = tmp_path / "k.cu"
    src.write_text("__global__ void k() {}\n")
    monkeypatch.setenv("PATH", os.environ["PATH"] + os.pathsep + "/usr/bin:/bin")
    monkeypatch.setenv("OPSMITH_CUDA_WITH_CPU_TORCH", "1")  # past the CPU-only-torch check, to nvcc's
    with pytest.raises(ToolchainError, match="nvcc"):
        opsmith.build("k_ext", [str(src)], is_python_module=False)


def test_torch_cuda_major_mismatch_is_an_error_minor_a_note(monkeypatch, caplog):
    from opsmith._toolchain import _nvcc
    from opsmith._toolchain import _cxx as _toolchain
    real = _toolchain.torch_info()
    monkeypatch.setattr(_toolchain, "torch_info", lambda: real._replace(cuda="12.8"))
    _nvcc._check_torch.cache_clear()
    with pytest.raises(ToolchainError, match=r"nvcc is 13\.0.*CUDA 12\.8.*install CUDA 12\.x"):
        _nvcc._check_torch("13.0", "PATH", "/x/nvcc")
    _nvcc._check_torch.cache_clear()
    with caplog.at_level("INFO", logger="opsmith"):
        _nvcc._check_torch("12.0", "PATH", "/x/nvcc")
    assert "minor version difference" in caplog.text
    _nvcc._check_torch.cache_clear()


def test_unsupported_host_compiler_is_refused_with_the_fix():
    from opsmith._toolchain._nvcc import Nvcc
    nv = Nvcc("/x/nvcc", "/x", "12.4", "", "/usr/bin/g++-15", "gcc", "15.1", ("9.0",), (), (), "-lcudart", "f")
    with pytest.raises(ToolchainError, match=r"supports gcc versions 6 to 13.*CC=g\+\+-13"):
        nv.check_host()
    nv.check_host(["-allow-unsupported-compiler"])  # the user's explicit override
    nv._replace(host_version="13.2").check_host()


# --- nvcc for real --------------------------------------------------------------------------------

KERNEL = r"""
#include <cuda_runtime.h>
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float v = x[i]; y[i] = v > 0 ? v : 0.f; }
}
void relu_cuda_launcher(const float* x, float* y, int n) {
    relu_kernel<<<(n + 255) / 256, 256>>>(x, y, n);
}
"""


@pytest.fixture
def cache_dir_env():
    return None


@pytest.fixture
def nvcc(fresh_cache):
    _nvcc_or_skip()
    from opsmith._cache._open import open_cache
    from opsmith._toolchain._nvcc import find_nvcc
    from opsmith._toolchain._cxx import find_cxx
    state = open_cache().state
    return find_nvcc(find_cxx(state), state)


def test_nvcc_is_probed_once_and_remembered(nvcc, fresh_cache):
    from opsmith._toolchain import _nvcc
    assert nvcc.version.count(".") == 1 and nvcc.archs and "9.0" in nvcc.archs
    assert any(os.path.isfile(os.path.join(d, "cuda_runtime.h")) for d in nvcc.include_dirs)
    _nvcc._probe_cached.cache_clear()
    calls = []
    real_run = subprocess.run
    try:
        subprocess.run = lambda *a, **k: calls.append(a) or real_run(*a, **k)
        from opsmith._cache._open import open_cache
        from opsmith._toolchain._cxx import find_cxx
        state = open_cache().state
        again = _nvcc.find_nvcc(find_cxx(state), state)
    finally:
        subprocess.run = real_run
    assert again == nvcc and calls == []


def test_nvcc_compiles_a_cu_without_torch_headers_to_an_object(nvcc, tmp_path, no_gpu, monkeypatch):
    from opsmith._build._engine import _Toolchain
    from opsmith._spec import ExtensionSpec
    from opsmith._cache._open import open_cache
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0+PTX")
    src = tmp_path / "relu_kernel.cu"
    src.write_text(KERNEL)
    spec = ExtensionSpec.from_files("relu_k", [str(src)], kind="module")
    assert spec.with_cuda
    tc = _Toolchain(open_cache(), spec)
    flags = TorchExtension().cuda_flags(spec, tc)
    assert "-gencode=arch=compute_80,code=sm_80" in flags and "-gencode=arch=compute_90,code=compute_90" in flags
    assert flags[flags.index("--threads") + 1] == "2"
    assert "-DTORCH_EXTENSION_NAME=opsmith_ext" in flags
    obj = tmp_path / "relu_kernel.o"
    r = subprocess.run([tc.nvcc.path, *flags, "-c", str(src), "-o", str(obj)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    nm = subprocess.run(["nm", "-C", str(obj)], capture_output=True, text=True).stdout
    assert "relu_cuda_launcher(float const*, float*, int)" in nm
    # a setuptools build names the module for real
    spec2 = ExtensionSpec.from_files("relu_k", [str(src)], kind="module", module_name="myrelu")
    assert "-DTORCH_EXTENSION_NAME=myrelu" in TorchExtension().cuda_flags(spec2, tc)


def test_user_arch_flags_win_as_in_torch(nvcc, tmp_path, no_gpu, monkeypatch):
    from opsmith._build._engine import _Toolchain
    from opsmith._spec import ExtensionSpec
    from opsmith._cache._open import open_cache
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    src = tmp_path / "k.cu"
    src.write_text(KERNEL)
    spec = ExtensionSpec.from_files("k", [str(src)], kind="module", extra_cuda_cflags=["-arch=sm_90"])
    tc = _Toolchain(open_cache(), spec)
    flags = TorchExtension().cuda_flags(spec, tc)
    assert not any(f.startswith("-gencode") for f in flags) and flags[-1] == "-arch=sm_90"


def test_standalone_cuda_program_builds_and_is_cached(nvcc, tmp_path, no_gpu):
    src = tmp_path / "prog.cu"
    src.write_text(KERNEL + '\n#include <cstdio>\nint main() { std::printf("ok\\n"); return 0; }\n')
    art = opsmith.build("prog", [str(src)], is_standalone=True, is_python_module=False)
    assert art.built and art.compiled_units == 1
    again = opsmith.build("prog", [str(src)], is_standalone=True, is_python_module=False)
    assert not again.built and again.path == art.path


def test_kernel_compile_error_points_at_the_users_cu_line(nvcc, tmp_path, no_gpu, fresh_cache):
    src = tmp_path / "bad_kernel.cu"
    src.write_text(KERNEL.replace("float v = x[i];", "float v = undefined_thing(x[i]);"))
    with pytest.raises(CompileError) as ei:
        opsmith.build("bad", [str(src)], is_standalone=True, is_python_module=False)
    e = ei.value
    assert e.source.endswith("bad_kernel.cu") and e.line == 5, str(e)
    assert "undefined_thing" in str(e).splitlines()[0]
    assert str(e).splitlines()[0].startswith(f"{src}:5")
    assert "> 5 |" in str(e) and "nvcc" in " ".join(e.command)
    # nothing half-built is left in the cache: no entries, no build directories
    entries = list((fresh_cache / "entries").glob("*")) if (fresh_cache / "entries").exists() else []
    assert not [p for p in entries if (p / "prog").exists()]
    tmp = fresh_cache / "tmp"
    assert not tmp.exists() or not any(p.name.startswith("build-bad") for p in tmp.iterdir())


def test_inline_cuda_source_error_names_cuda_sources_index(nvcc, no_gpu):
    with pytest.raises(CompileError) as ei:
        opsmith.build_inline("bad_inline", "", cuda_sources=["__global__ void k() {\n  nope;\n}\n"],
                             no_implicit_headers=True, is_standalone=True, is_python_module=False)
    assert ei.value.source == "cuda_sources[0]" and ei.value.line == 2, str(ei.value)


def test_link_error_names_the_undefined_symbol(nvcc, tmp_path, no_gpu):
    src = tmp_path / "main.cu"
    src.write_text(KERNEL + "\nvoid missing_launcher(int);\nint main() { missing_launcher(3); return 0; }\n")
    with pytest.raises(LinkError, match=r"(?s)undefined symbol `missing_launcher\(int\)`.*CUDA source"):
        opsmith.build("linkerr", [str(src)], is_standalone=True, is_python_module=False)


def test_nvcc_fatal_arch_error_gets_the_fix(nvcc, tmp_path, no_gpu):
    src = tmp_path / "k.cu"
    src.write_text(KERNEL)
    with pytest.raises(CompileError, match=r"fix: nvcc cannot build compute_12"):
        opsmith.build("archerr", [str(src)], is_standalone=True, is_python_module=False,
                      extra_cuda_cflags=["-gencode=arch=compute_12,code=sm_12"])


def test_setuptools_extension_objects():
    from opsmith.setuptools import BuildExtension, CppExtension, CUDAExtension
    ext = CUDAExtension("pkg.myrelu", ["relu.cpp", "relu_kernel.cu"],
                        extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3"]})
    assert ext.name == "pkg.myrelu" and ext._opsmith_cuda is True and ext.language == "c++"
    assert CppExtension("a", ["a.cpp"])._opsmith_cuda is None
    assert BuildExtension.with_options(use_ninja=False) is BuildExtension


def test_nvcc_std_is_the_one_torch_gives_nvcc(tmp_path):
    from opsmith._cache._state import State
    from opsmith._toolchain._cxx import _torch_stds
    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "cpp_extension.py").write_text(
        "x = {'cxx': ['-std=c++20']}  # a docstring example\n"
        "        cflags = common_cflags + ['-fPIC', '-std=c++20']\n"
        "            if not any(flag.startswith('-std=') for flag in cuda_flags):\n"
        "                cuda_flags.append('-std=c++17')\n")
    state = State(tmp_path / "cache")
    assert _torch_stds(str(tmp_path), state) == ("c++20", "c++17")  # one reader, both standards
    assert _torch_stds(str(tmp_path), state) == ("c++20", "c++17")  # the second from the state
    assert _torch_stds(str(tmp_path / "none"), state) == ("c++17", "c++17")


MODULE_CU = r"""
#include <Python.h>
#include <cuda_runtime.h>
#define STR2(x) #x
#define STR(x) STR2(x)
#define INIT2(n) PyInit_##n
#define INIT(n) INIT2(n)
__global__ void twice(float* x) { x[threadIdx.x] *= 2.f; }
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, STR(TORCH_EXTENSION_NAME), nullptr, -1, nullptr};
PyMODINIT_FUNC INIT(TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&def); }
"""

SETUP_PY = """
from setuptools import setup
from opsmith.setuptools import CUDAExtension, BuildExtension
setup(name="pkg", packages=["pkg"],
      ext_modules=[CUDAExtension("pkg.fastmod", ["mod.cu"], extra_compile_args={"nvcc": ["-O2"]})],
      cmdclass={"build_ext": BuildExtension})
"""


def test_setuptools_build_ext_inplace_with_the_real_module_name(nvcc, tmp_path, fresh_cache):
    import sys
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "mod.cu").write_text(MODULE_CU)
    (tmp_path / "setup.py").write_text(SETUP_PY)
    env = dict(os.environ, TORCH_CUDA_ARCH_LIST="8.0", OPSMITH_CUDA_WITH_CPU_TORCH="1", PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(opsmith.__file__)), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tmp_path, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    built = list((tmp_path / "pkg").glob("fastmod*.so"))
    assert len(built) == 1, r.stdout[-2000:]
    syms = subprocess.run(["nm", "-D", str(built[0])], capture_output=True, text=True).stdout
    assert "PyInit_fastmod" in syms  # TORCH_EXTENSION_NAME is the extension's own name
    r = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tmp_path, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0 and "nothing compiled" in r.stdout, r.stdout[-2000:]
