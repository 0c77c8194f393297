"""opsmith export-c without a GPU: the export, the generated C compiled four ways, no libcuda at
link time, the manifest, errors, the run-time logic against a fake driver, and the export's speed."""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import opsmith
from opsmith._errors import SpecError

HERE = Path(__file__).parent
SRC = r'''
extern "C" __global__ void relu(const float* __restrict__ x, float* __restrict__ y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
template <typename T>
__global__ void scale(T* x, T a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
__global__ void big_shared(float* out, int stream) {  // 'stream' clashes with the launcher's own name
    extern __shared__ float buf[];
    __shared__ float fixed[300];
    fixed[threadIdx.x % 300] = threadIdx.x;
    buf[threadIdx.x] = threadIdx.x + stream;
    __syncthreads();
    out[threadIdx.x] = buf[blockDim.x - 1 - threadIdx.x] + fixed[0];
}
'''
KERNELS = ["relu", "scale_f=scale<float>", "big_shared"]
needs_cc = pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("clang")), reason="needs gcc and clang")


def _export(tmp_path, **kw):
    (tmp_path / "t.cu").write_text(SRC)
    kw.setdefault("archs", ["sm_80", "sm_90"])
    return opsmith.export_c(tmp_path / "t.cu", KERNELS, out_dir=tmp_path / "out", prefix="t", **kw)


def _run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _fake_driver(tmp_path) -> Path:
    d = tmp_path / "fakecuda"
    d.mkdir(exist_ok=True)
    _run(["gcc", "-std=c99", "-O1", "-shared", "-fPIC", "-o", d / "libcuda.so.1", HERE / "fake_libcuda.c", "-lpthread"])
    return d


def _kv(text: str) -> dict:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


@needs_cc
def test_export_compiles_warning_free_four_ways_and_runs_against_a_fake_driver(tmp_path):
    res = _export(tmp_path, archs=None, library="both")  # the default archs
    assert res.archs[-1].startswith("compute_") and "sm_90" in res.archs and "sm_80" in res.archs
    assert res.kernels == {"relu": "opsmith_t_relu_launch", "scale<float>": "opsmith_t_scale_f_launch",
                           "big_shared": "opsmith_t_big_shared_launch"}
    header = res.header.read_text()
    assert ("opsmith_CUresult opsmith_t_relu_launch(opsmith_CUstream stream, opsmith_dim3 grid, opsmith_dim3 "
            "block, unsigned shared_mem, const float *x, float *y, long long n);") in header
    assert "float *x, float a, int n);" in header and "float *out, int stream_);" in header
    assert "#include <cuda" not in header and "#include <cuda" not in res.source.read_text()
    out = res.header.parent
    flags = ["-Wall", "-Wextra", "-Werror", "-pedantic", f"-I{out}", "-I" + str(HERE)]
    objs = {}
    for compiler, lang in [("gcc", ["-std=c99"]), ("clang", ["-std=c99"]), ("g++", ["-x", "c++", "-std=c++17"]),
                           ("clang++", ["-x", "c++", "-std=c++17"])]:
        objs[compiler] = tmp_path / f"t_{compiler}.o"
        _run([compiler, *lang, *flags, "-c", res.source, "-o", objs[compiler]])
    # nothing links against libcuda, torch or Python
    for lib in (res.shared_library,):
        needed = _run(["readelf", "-d", lib])
        assert "NEEDED" in needed
        for bad in ("libcuda", "libtorch", "libc10", "libpython", "libcudart"):
            assert bad not in needed, needed
    assert res.static_library.stat().st_size > 0
    exported = _run(["nm", "-D", "--defined-only", res.shared_library])
    assert "opsmith_t_relu_launch" in exported and "osm_" not in exported  # only the API is exported

    # the run-time logic, against a fake libcuda.so.1 that records what it is asked
    fake = _fake_driver(tmp_path)
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake)}
    for compiler, obj in [("gcc", objs["gcc"]), ("g++", objs["clang++"])]:
        exe = tmp_path / f"check_{compiler}"
        _run([compiler, "-I", out, "-x", "c", HERE / "check_export.c", "-x", "none", obj, "-o", exe,
              "-ldl", "-lpthread"])
        kv = _kv(_run([exe, "basic"], env=env))
        assert kv["relu"] == "0" and kv["symbol"] == "relu" and kv["grid"] == "7,2,1" and kv["block"] == "128,1,1"
        assert kv["stream"] == "0x1234" and kv["arg0_ok"] == kv["arg1_ok"] == kv["arg2_ok"] == "1"
        assert kv["current_is_device0"] == "1" and kv["arch0"] == "sm_90"  # no context: device 0's, as the runtime
        assert kv["scale"] == "0" and kv["scale_symbol"] == "_Z5scaleIfEvPT_S0_i" and kv["arg1_float_ok"] == "1"
        assert kv["big_shared"] == "0" and kv["max_dynamic_shared"] == "232448"  # opted in above 48 KiB
        assert kv["bad_launch"] == "1" and "launching relu with grid (0, 1, 1)" in kv["bad_message"]
        assert kv["null_out"] == "1" and kv["bad_device"] == "101" and "no CUDA device 5" in kv["bad_device_message"]
        assert kv["other_ctx"] == "201" and "not device 0's primary context" in kv["other_ctx_message"]
        assert kv["get_proc"] == "0" and kv["get_proc_found"] == "1" and kv["get_proc_missing"] == "500"
        assert kv["unload"] == "0" and kv["modules_unloaded"] == kv["modules_loaded"] == "1"
        assert kv["released"] == "1" and kv["arch0_after"] == "none"
        assert kv["reload"] == "0" and kv["modules_loaded_again"] == "2"
        kv = _kv(_run([exe, "threads"], env=env))
        assert kv == {"failed": "0", "modules_loaded": "1"}  # 8 threads, one load
    # the device's compute capability picks the code: same major, highest minor, else the PTX
    for ccs, expect in [("8.7,13.0", ("sm_86", "compute_120")), ("8.9,12.1", ("sm_89", "sm_120")),
                        ("10.3,9.0", ("sm_100", "sm_90"))]:
        kv = _kv(_run([exe, "arch"], env={**env, "FAKE_CUDA_CC": ccs}))
        assert (kv["arch0"], kv["arch1"]) == expect, kv
    kv = _kv(_run([exe, "arch"], env={**env, "FAKE_CUDA_CC": "7.0,9.0"}))
    assert kv["load0"] == "209" and "compute capability 7.0" in kv["arch0"] and "--arch sm_70" in kv["arch0"]
    # no driver at all: a returned error with the reason, never an exit
    try:
        ctypes.CDLL("libcuda.so.1")
        has_driver = True
    except OSError:
        has_driver = False
    if not has_driver:
        kv = _kv(_run([exe, "nodriver"], env={k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}))
        assert kv["load"] == "3" and "libcuda.so.1 could not be opened" in kv["message"]
        assert kv["error_string"].startswith("CUDA_ERROR_NOT_INITIALIZED")


def test_manifest_describes_kernels_archs_resources_and_keys(tmp_path):
    res = _export(tmp_path)
    m = json.loads(res.manifest.read_text())
    assert m["format"] == "opsmith.export-c" and m["version"] == 1 and m["prefix"] == "t"
    assert m["archs"] == [{"arch": "sm_80", "kind": "cubin"}, {"arch": "sm_90", "kind": "cubin"},
                          {"arch": "compute_90", "kind": "ptx"}]
    images = m["modules"][0]["images"]
    assert [i["arch"] for i in images] == ["sm_80", "sm_90", "compute_90"]
    assert all(len(i["cache_key"]) >= 32 and i["bytes"] > 0 for i in images)
    k = {x["name"]: x for x in m["kernels"]}
    assert set(k) == {"relu", "scale<float>", "big_shared"}
    assert k["scale<float>"]["c_name"] == "scale_f" and k["scale<float>"]["symbol"] == "_Z5scaleIfEvPT_S0_i"
    sig = k["relu"]["signature"]
    from opsmith._runtime._signature import KernelSignature
    assert KernelSignature.from_json(sig).to_json() == sig and [p["kind"] for p in sig["params"]] == \
        ["tensor", "tensor", "int"]
    for arch in ("sm_80", "sm_90"):
        r = k["big_shared"]["resources"][arch]
        assert 0 < r["registers"] <= 255
        assert r["shared_bytes"] in (1200, 1200 + 1024)  # fixed[300]; sm_90 may count 1 KiB reserved
        assert k["relu"]["resources"][arch]["shared_bytes"] in (0, 1024)
    assert k["relu"]["launch"] == "opsmith_t_relu_launch"


def test_bad_input_gives_clear_errors(tmp_path):
    (tmp_path / "t.cu").write_text(SRC)
    cu = tmp_path / "t.cu"
    with pytest.raises(SpecError, match=r"no kernel 'nope' in .*relu"):
        opsmith.export_c(cu, ["nope"], out_dir=tmp_path, archs=["sm_90"])
    with pytest.raises(SpecError, match=r"template <T>: name an instantiation, e.g. 'scale<float>'"):
        opsmith.export_c(cu, ["scale"], out_dir=tmp_path, archs=["sm_90"])
    with pytest.raises(SpecError, match="cannot compile for sm_35"):
        opsmith.export_c(cu, ["relu"], out_dir=tmp_path, archs=["sm_35"])
    with pytest.raises(SpecError, match="not a C identifier"):
        opsmith.export_c(cu, ["relu"], out_dir=tmp_path, archs=["sm_90"], prefix="my-lib")
    with pytest.raises(SpecError, match="would both be called 'x' in C"):
        opsmith.export_c(cu, ["x=relu", "x=big_shared"], out_dir=tmp_path, archs=["sm_90"])
    with pytest.raises(SpecError, match="library must be"):
        opsmith.export_c(cu, ["relu"], out_dir=tmp_path, archs=["sm_90"], library="dll")
    (tmp_path / "only_t.cu").write_text("template <int N> __global__ void k(float* x) {}\n")
    with pytest.raises(SpecError, match=r"only templates \(k\)"):
        opsmith.export_c(tmp_path / "only_t.cu", out_dir=tmp_path, archs=["sm_90"])
    (tmp_path / "s.cu").write_text('struct P { float a; };\nextern "C" __global__ void k(P p) {}\n')
    with pytest.raises(SpecError, match="a C launcher cannot pass"):
        opsmith.export_c(tmp_path / "s.cu", ["k"], out_dir=tmp_path, archs=["sm_90"])
    (tmp_path / "bad.cu").write_text('extern "C" __global__ void k(float* x) { x[0] = undefined_name; }\n')
    with pytest.raises(opsmith.CompileError, match="undefined_name"):
        opsmith.export_c(tmp_path / "bad.cu", ["k"], out_dir=tmp_path, archs=["sm_80", "sm_90"])


def test_cli_exports_and_reports(tmp_path):
    (tmp_path / "t.cu").write_text(SRC)
    proc = subprocess.run([sys.executable, "-m", "opsmith", "export-c", str(tmp_path / "t.cu"), "-k", "relu",
                           "-k", "scale<float>", "--arch", "sm_90", "--no-ptx", "-o", str(tmp_path / "o"), "--json"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["archs"] == ["sm_90"] and data["kernels"]["scale<float>"] == "opsmith_t_scale_float_launch"
    assert sorted(Path(f).name for f in data["files"]) == ["t.c", "t.h", "t.json"]
    proc = subprocess.run([sys.executable, "-m", "opsmith", "export-c", str(tmp_path / "t.cu"), "-k", "scale",
                           "-o", str(tmp_path / "o")], capture_output=True, text=True)
    assert proc.returncode == 1 and "name an instantiation" in proc.stderr


def test_embedding_is_exact_and_fast():
    from opsmith._runtime._launch_gen import embed_literal
    data = bytes(range(256)) * 4096  # 1 MiB, every byte value
    t = time.perf_counter()
    text = embed_literal("img", data)
    took = time.perf_counter() - t
    body = "".join(line.strip().strip('";') for line in text.splitlines()[1:])
    assert bytes.fromhex(body.replace("\\x", "")) == data
    assert took < 0.5, f"embedding 1 MiB took {took:.2f} s"


def test_export_of_100_kernels_is_quick(tmp_path):
    src = "\n".join(f'extern "C" __global__ void k{i}(const float* x, float* y, long long n) {{ long long j = '
                    f'blockIdx.x * (long long)blockDim.x + threadIdx.x; if (j < n) y[j] = x[j] * {i}.0f; }}'
                    for i in range(100))
    (tmp_path / "k100.cu").write_text(src)
    t = time.perf_counter()
    res = opsmith.export_c(tmp_path / "k100.cu", out_dir=tmp_path / "o", archs=["sm_80", "sm_90"])
    cold = time.perf_counter() - t
    assert len(res.kernels) == 100
    t = time.perf_counter()
    res = opsmith.export_c(tmp_path / "k100.cu", out_dir=tmp_path / "o", archs=["sm_80", "sm_90"])
    warm = time.perf_counter() - t
    print(f"100 kernels, 2 archs + PTX: cold {cold:.2f} s, warm {warm:.2f} s, {res.seconds}")
    assert res.seconds["generate"] + res.seconds["write"] < 1.5  # embedding is never the slow step
    assert warm < 5.0


@needs_cc
def test_the_cpp_example_builds_with_no_cuda_torch_or_python_dependency(tmp_path):
    proc = subprocess.run([str(HERE.parent.parent / "examples" / "export_c" / "build.sh"), str(tmp_path)],
                          capture_output=True, text=True, env={**os.environ, "EXPORT_ARGS": "--arch sm_90"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    needed = _run(["readelf", "-d", tmp_path / "example"])
    for bad in ("libcuda", "libtorch", "libc10", "libpython", "libcudart"):
        assert bad not in needed, needed
    fake = _fake_driver(tmp_path)  # its driver has no cuMemAlloc: the example reports that and stops (no crash)
    run = subprocess.run([tmp_path / "example"], capture_output=True, text=True, env={**os.environ,
                                                                                     "LD_LIBRARY_PATH": str(fake)})
    assert run.returncode == 2 and "no entry point cuMemAlloc" in run.stderr


def test_the_public_header_template_is_package_data_and_compiles_alone(tmp_path):
    """templates/export_c.h, found through importlib.resources (not a path in the checkout), listed
    in pyproject's package data, filled from a sample and compiled alone as C99 and C++17."""
    import fnmatch
    from importlib import resources

    import tomllib

    from opsmith._build._launch_unit import LaunchUnit
    from opsmith._runtime._launch_gen import LaunchKernel, generate
    from opsmith._runtime._signature import KernelSignature
    from opsmith.export_c._generate import TEMPLATES, public_header, template_text
    folder = resources.files("opsmith.export_c").joinpath("templates")
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == sorted(TEMPLATES)
    patterns = tomllib.loads((HERE.parent.parent / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"].get("opsmith.export_c", [])
    for name in TEMPLATES:
        assert template_text(name) == folder.joinpath(name).read_text(encoding="utf-8")
        assert any(fnmatch.fnmatch(f"templates/{name}", p) for p in patterns), (name, patterns)
    with pytest.raises(SpecError, match="no export-c template 'nope.h'"):
        template_text("nope.h")
    kernels = [LaunchKernel("scale<float>", "scale_f", 0, KernelSignature.parse("scale<float>", "float* x, float a"))]
    targets = [("sm_90", "cubin"), ("sm_90", "ptx")]
    unit = LaunchUnit(prefix="s", kernels=kernels, targets=targets, modules=["s.cu"], binaries=None,
                      code=generate("s", kernels, targets, [[b"x"], [b"y"]]), seconds={})
    header = public_header(unit)
    assert header.startswith("/* s.h: generated by opsmith ")
    assert " *   opsmith_s_scale_f_launch: scale<float>\n" in header
    assert " * Code: sm_90, compute_90 (PTX: compute_*)\n" in header and header.endswith("#endif /* OPSMITH_S_H_ */\n")
    (tmp_path / "s.h").write_text(header)
    (tmp_path / "alone.c").write_text('#include "s.h"\n')
    for compiler in ("gcc", "clang", "g++", "clang++"):
        if shutil.which(compiler) is None:
            continue  # the four-way test above says which are needed
        lang = ["-x", "c++", "-std=c++17"] if compiler.endswith("++") else ["-x", "c", "-std=c99"]
        _run([compiler, *lang, "-Wall", "-Wextra", "-Werror", "-pedantic", f"-I{tmp_path}", "-c",
              tmp_path / "alone.c", "-o", tmp_path / f"alone_{compiler}.o"])


def test_the_package_is_also_the_function(tmp_path):
    """opsmith.export_c is the target package and the function: importing the package first (as
    the CLI does) leaves opsmith.export_c(...) working."""
    code = ("import opsmith.export_c._cli, opsmith, sys\n"
            f"r = opsmith.export_c({str(tmp_path / 't.cu')!r}, ['relu'], out_dir={str(tmp_path / 'o')!r}, "
            "archs=['sm_90'], ptx=False)\n"
            "print(type(opsmith.export_c).__name__, r.kernels['relu'], opsmith.CExport is type(r))\n")
    (tmp_path / "t.cu").write_text(SRC)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "OPSMITH_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["_CallablePackage", "opsmith_t_relu_launch", "True"]
    from opsmith.export_c import COMMON_ARCHS, build_c_library, default_archs, embed_literal, export_c
    assert callable(build_c_library) and callable(default_archs) and callable(embed_literal)
    assert "sm_90" in COMMON_ARCHS and export_c.__module__ == "opsmith.export_c._export"



@needs_cc
def test_the_libraries_are_built_by_the_engine_cached_and_cc_is_honoured(tmp_path, caplog):
    """lib<prefix>.a and .so come from opsmith's build engine (one C unit for both, cached):
    an export again builds nothing; cc= picks the C compiler; an unknown one is named."""
    import logging

    from opsmith._errors import ToolchainError
    with caplog.at_level(logging.INFO, logger="opsmith.build"):
        res = _export(tmp_path, archs=["sm_90"], library="both", cc="clang")
    built = [r.getMessage() for r in caplog.records if r.getMessage().startswith("built ")]
    assert len(built) == 2 and "1 of 1 units compiled" in built[0] and "0 of 1 units compiled" in built[1], built
    assert res.static_library.name == "libt.a" and res.shared_library.name == "libt.so"
    comment = _run(["readelf", "-p", ".comment", res.shared_library])
    assert "clang version" in comment, comment
    assert _run(["ar", "t", res.static_library]).split() == ["t.o"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="opsmith.build"):
        again = _export(tmp_path, archs=["sm_90"], library="both", cc="clang")
    assert not [r for r in caplog.records if r.getMessage().startswith("built ")]  # from the cache
    assert again.shared_library.read_bytes() == res.shared_library.read_bytes()
    with pytest.raises(ToolchainError, match="no C compiler named 'no-such-cc' on PATH"):
        _export(tmp_path, archs=["sm_90"], library="shared", cc="no-such-cc")
