"""NVRTC compilation without a GPU: cubin and PTX, the cache, name expressions, errors."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

import pytest

import opsmith
from opsmith import CompileError, ToolchainError
from opsmith._build import _nvrtc

nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings is not installed (opsmith[cuda])")


def _nvrtc_loadable() -> bool:
    try:
        _nvrtc.nvrtc_version()
    except ToolchainError:
        return False
    return True


pytestmark = pytest.mark.skipif(not _nvrtc_loadable(), reason="libnvrtc is not installed (nvidia-cuda-nvrtc)")

RELU = r"""
extern "C" __global__ void relu(const float* __restrict__ x, float* __restrict__ y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
"""
TEMPLATED = r"""
template <typename T, int N>
__global__ void scale(T* x, T a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = a * x[i] * N;
}
"""


@pytest.fixture(autouse=True)
def _fresh_memo():
    _nvrtc._memo.clear()
    yield
    _nvrtc._memo.clear()


def test_compile_to_cubin_for_the_given_arch():
    b = opsmith.compile_cuda(RELU, arch="sm_90")
    assert b.kind == "cubin" and b.arch == "sm_90" and b.code[:4] == b"\x7fELF"
    assert not b.from_cache and b.nvrtc_version.count(".") == 1


def test_compile_to_ptx():
    b = opsmith.compile_cuda(RELU, arch="9.0", output="ptx")
    text = b.code.decode()
    assert b.kind == "ptx" and ".target sm_90" in text and ".entry relu" in text


def test_cache_hit_makes_no_nvrtc_call_and_options_change_the_key():
    before = _nvrtc.nvrtc_stats["compiles"]
    a = opsmith.compile_cuda(RELU, arch="sm_90")
    assert _nvrtc.nvrtc_stats["compiles"] == before + 1
    _nvrtc._memo.clear()  # force the store, not the in-process memo
    b = opsmith.compile_cuda(RELU, arch="sm_90")
    assert _nvrtc.nvrtc_stats["compiles"] == before + 1 and b.from_cache and b.code == a.code
    for kwargs in ({"arch": "sm_80"}, {"arch": "sm_90", "defines": {"FAST": 1}},
                   {"arch": "sm_90", "options": ["-lineinfo"]}, {"arch": "sm_90", "std": "c++20"}):
        c = opsmith.compile_cuda(RELU, **kwargs)
        assert not c.from_cache and c.key != a.key
    assert _nvrtc.nvrtc_stats["compiles"] == before + 5


def test_header_bytes_are_in_the_key(tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "act.cuh").write_text("__device__ inline float act(float v) { return v > 0.f ? v : 0.f; }\n")
    src = '#include "act.cuh"\nextern "C" __global__ void k(float* x) { x[0] = act(x[0]); }\n'
    a = opsmith.compile_cuda(src, arch="sm_90", include_paths=[inc])
    _nvrtc._memo.clear()
    assert opsmith.compile_cuda(src, arch="sm_90", include_paths=[inc]).from_cache
    (inc / "act.cuh").write_text("__device__ inline float act(float v) { return v > 1.f ? v : 1.f; }\n")
    b = opsmith.compile_cuda(src, arch="sm_90", include_paths=[inc])
    assert not b.from_cache and b.key != a.key


def test_source_file_directory_is_an_include_path(tmp_path):
    (tmp_path / "helper.cuh").write_text("#define SCALE 3.0f\n")
    cu = tmp_path / "k.cu"
    cu.write_text('#include "helper.cuh"\nextern "C" __global__ void k(float* x) { x[0] *= SCALE; }\n')
    b = opsmith.compile_cuda(cu, arch="sm_90")
    assert b.name == str(cu) and b.kind == "cubin"


def test_in_memory_headers():
    src = '#include "my.h"\nextern "C" __global__ void k(float* x) { x[0] = TWO; }\n'
    b = opsmith.compile_cuda(src, arch="sm_90", headers={"my.h": "#define TWO 2.0f\n"})
    c = opsmith.compile_cuda(src, arch="sm_90", headers={"my.h": "#define TWO 2.5f\n"})
    assert b.key != c.key


def test_name_expressions_are_lowered_and_cached():
    exprs = ["scale<float, 2>", "scale<double, 4>"]
    b = opsmith.compile_cuda(TEMPLATED, arch="sm_90", name_expressions=exprs)
    assert b.lowered_names["scale<float, 2>"].startswith("_Z5scaleIfLi2EEvPT_S0_i")
    assert set(b.lowered_names) == set(exprs)
    _nvrtc._memo.clear()
    again = opsmith.compile_cuda(TEMPLATED, arch="sm_90", name_expressions=exprs)
    assert again.from_cache and again.lowered_names == b.lowered_names


def test_module_resolves_name_expression_and_plain_cpp_kernels():
    src = TEMPLATED + "__global__ void plain(float* x) { x[0] = 1.f; }\n"
    mod = opsmith.CudaModule(src, arch="sm_90", name_expressions=["scale<float, 2>"])
    k = mod.get_kernel("scale<float, 2>")
    assert k.symbol == mod.binary.lowered_names["scale<float, 2>"]
    assert [p.kind for p in k.params] == ["tensor", "float", "int"] and k.params[0].dtypes == ("float32",)
    assert mod.get_kernel("plain").symbol.startswith("_Z5plain")  # lowered automatically
    with pytest.raises(opsmith.SpecError, match="name_expressions="):
        mod.get_kernel("scale<int, 2>")
    with pytest.raises(opsmith.SpecError, match="no kernel 'nope'"):
        mod.get_kernel("nope")


def test_a_kernel_declared_in_an_included_header_asks_for_its_signature():
    """Its parameters are read from the source text given; one from a header says so (it raised
    AttributeError from inside the signature parser)."""
    header = TEMPLATED
    mod = opsmith.CudaModule('#include "k.cuh"\n', arch="sm_90", headers={"k.cuh": header},
                             name_expressions=["scale<float, 2>"])
    with pytest.raises(opsmith.SpecError, match=r"declaration is not in that source text.*signature="):
        mod.get_kernel("scale<float, 2>")
    k = mod.get_kernel("scale<float, 2>", signature="float* x, float a, int n")
    assert [p.kind for p in k.params] == ["tensor", "float", "int"]
    k = mod.get_kernel("scale<float, 2>", signature=" (float* x, float a, int n) ")  # as a declaration writes it
    assert [p.kind for p in k.params] == ["tensor", "float", "int"]


def test_compile_error_points_at_the_users_line():
    src = "extern \"C\" __global__ void k(float* x) {\n    float v = x[0];\n    x[0] = v + undefined_name;\n}\n"
    with pytest.raises(CompileError) as info:
        opsmith.compile_cuda(src, arch="sm_90", name="my_kernel.cu")
    err = info.value
    assert err.line == 3 and err.source == "my_kernel.cu"
    msg = str(err)
    assert msg.startswith("my_kernel.cu:3:16: error:") and "undefined_name" in msg
    assert "> 3 |     x[0] = v + undefined_name;" in msg and "--gpu-architecture=sm_90" in msg
    assert "undefined_name" in err.output and "-std=c++17" in err.options
    again = pickle.loads(pickle.dumps(err))
    assert again.line == 3 and str(again) == msg


def test_missing_header_error_says_how_to_fix():
    with pytest.raises(CompileError, match="include_paths="):
        opsmith.compile_cuda('#include "nowhere.cuh"\n__global__ void k() {}\n', arch="sm_90")


def test_bad_arch_and_output_are_spec_errors():
    with pytest.raises(opsmith.SpecError, match="sm_90"):
        opsmith.compile_cuda(RELU, arch="hopper")
    with pytest.raises(opsmith.SpecError, match="cubin"):
        opsmith.compile_cuda(RELU, arch="sm_90", output="fatbin")


def test_arch_from_setting(monkeypatch):
    monkeypatch.setenv("OPSMITH_CUDA_ARCH", "8.0")
    mod = opsmith.CudaModule(RELU)
    assert mod.binary.arch == "sm_80"


def test_warm_load_in_a_fresh_process_does_not_load_nvrtc(tmp_path):
    script = textwrap.dedent(f"""
        import time, opsmith
        from opsmith._build import _nvrtc
        t = time.perf_counter()
        k = opsmith.cuda_kernel({RELU!r}, "relu", arch="sm_90")
        dt = time.perf_counter() - t
        import sys
        loaded = _nvrtc.nvrtc_stats["library_loads"] + ("cuda.bindings.nvrtc" in sys.modules)
        print("RESULT", _nvrtc.nvrtc_stats["compiles"], int(loaded > 0), dt)
    """)
    env = dict(os.environ, OPSMITH_CACHE_DIR=str(tmp_path / "cache"))
    rows = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stderr[-2000:]
        rows.append(next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT")).split()[1:])
    assert rows[0][:2] == ["1", "1"]
    assert rows[1][:2] == ["0", "0"], rows  # a hit: no compile, NVRTC neither imported nor loaded


def test_missing_cuda_bindings_names_the_extra(monkeypatch):
    monkeypatch.setattr(_nvrtc, "_nvrtc_mod", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings.nvrtc", None)  # import fails
    with pytest.raises(ToolchainError, match=r"opsmith\[cuda\]"):
        _nvrtc._nvrtc()


def test_import_opsmith_stays_cheap():
    code = "import sys, opsmith; print(sorted(m for m in ('torch', 'cuda.bindings', 'filelock') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_nvrtc_errors_go_through_the_one_diagnostics_path_with_a_caret():
    """NVRTC's log is read by _build/_diagnostics like a compiler's: file:line:col, the source
    with a caret under the spot, the real options and no made-up command line."""
    src = 'extern "C" __global__ void k(float* y) {\n  int i = blockIdxx.x;\n  y[i] = 1.f;\n}\n'
    with pytest.raises(CompileError) as info:
        opsmith.compile_cuda(src, arch="sm_90", name="caret.cu")
    err = info.value
    text = str(err)
    assert text.startswith('caret.cu:2:11: error: identifier "blockIdxx" is undefined')
    lines = text.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("> 2 |"))
    assert lines[i + 1].index("^") == lines[i].index("blockIdxx")
    assert "NVRTC options: --gpu-architecture=sm_90" in text
    assert err.command == [] and err.line == 2 and err.source == "caret.cu"


def test_defines_as_a_dict_strings_or_pairs_are_one_request_and_bad_ones_say_what_to_pass():
    """{'N': 4}, ['N=4'] and [('N', 4)] (CompileRequest's own form) make the same request; one string, an
    item of another kind or a name that is no C identifier is a SpecError naming the forms (a pair used to
    reach NVRTC as -D('N', '4'): 'invalid macro definition')."""
    from opsmith._build._nvrtc_request import make_request
    from opsmith._errors import SpecError
    src = "#if N != 4\n#error N\n#endif\n" + RELU
    reqs = [make_request(src, arch="sm_90", defines=d) for d in ({"N": 4, "FAST": None}, ["N=4", "FAST"],
                                                                  [("N", 4), ("FAST", None)])]
    assert reqs[0] == reqs[1] == reqs[2] and reqs[0].defines == (("FAST", None), ("N", "4"))
    assert opsmith.compile_many([{"source": src, "arch": "sm_90", "defines": [("N", 4)]}], progress=False)[0].code
    for bad, said in (("N=4", "not one string"), ([3], "neither"), ([("N", 1, 2)], "neither"),
                      (["4N=1"], "not a macro name"), ({"N-1": 2}, "not a macro name")):
        with pytest.raises(SpecError, match=said):
            make_request(src, arch="sm_90", defines=bad)


@pytest.mark.parametrize("opts, verbose", [
    (["--ptxas-options=-v"], True), (["--ptxas-options=--verbose"], True), (["-Xptxas", "-v"], True),
    (["--ptxas-options", "-O3,-v"], True), (["-Xptxas=-O2"], False), (["-v"], False), (["-lineinfo"], False),
])
def test_ptxas_report_asks_nvrtc_to_skip_its_own_cache(opts, verbose):
    base = ["--gpu-architecture=sm_90", *opts]
    asked = _nvrtc._without_nvrtc_cache(base, (13, 0))
    assert asked == ([*base, "--no-cache"] if verbose else base)
    assert _nvrtc._without_nvrtc_cache(base, (12, 8)) == base  # NVRTC before 12.9 has no cache (nor the option)
    assert _nvrtc._without_nvrtc_cache([*base, "--no-cache"], (13, 0)).count("--no-cache") == 1


def test_ptxas_report_comes_back_in_the_log_each_time_nvrtc_compiles():
    """NVRTC 12.9 on skips ptxas for a program its own cache holds, and the report with it; opsmith
    adds --no-cache (which NVRTC must accept) to such compiles. The same program through NVRTC twice
    (opsmith's cache and memo bypassed): both logs have the report."""
    from opsmith._build._nvrtc_request import make_request
    req = make_request(RELU, arch="sm_90", options=["--ptxas-options=-v"])
    for _ in range(2):
        binary = _nvrtc._compile(req, "k", _nvrtc.nvrtc_version())
        assert "Compiling entry function 'relu'" in binary.log and "registers" in binary.log, binary.log
