"""The ONNX Runtime library's templates (opsmith/onnx/templates/): shipped as package data, each
compiled alone after filling it with a small sample, as C++17 with gcc and clang (whichever are
installed; a missing one is skipped with the reason), ``-Wall -Wextra -Werror``."""
from __future__ import annotations

import re
import shutil
import subprocess
from importlib import resources

import pytest

from opsmith._errors import SpecError
from opsmith.onnx._generate import PARALLEL_FOR_API_VERSION, TEMPLATES, fill, generate_source, template_text
from opsmith.onnx._specs import OrtOpSpec, OrtVariant

WARNINGS = ["-Wall", "-Wextra", "-Werror"]

# a CPU function of each contract, over two dtypes and two ops
SAMPLE_CPU = r"""
template <typename T> static void add_cpu(const T *a, const T *b, T *y, long long n) {
  for (long long i = 0; i < n; ++i) y[i] = a[i] + b[i];
}
template <typename T> static void neg_cpu(const T *x, T *y, long long n, const opsmith::cpu_context &cpu) {
  cpu.parallel_for(n, 1024, [=](long long begin, long long end) {
    for (long long i = begin; i < end; ++i) y[i] = -x[i];
  });
}
"""


def _cpu_variant(dtype: str, ctype: str, inputs: int) -> OrtVariant:
    params = [f"const {ctype} *in{i}" for i in range(inputs)] + [f"{ctype} *out0", "long long n"]
    binding = [f"in{i}" for i in range(inputs)] + ["out0", "n"]
    return OrtVariant(dtype=dtype, c_params=tuple(params), binding=tuple(binding))


SAMPLE_SPECS = [
    OrtOpSpec(domain="sample", name="add", inputs=2, outputs=1, like=(0,), cpu="add_cpu",
              variants=(_cpu_variant("float32", "float", 2), _cpu_variant("float64", "double", 2))),
    OrtOpSpec(domain="other", name="neg", inputs=1, outputs=1, like=(0,), cpu="neg_cpu",
              variants=(_cpu_variant("float32", "float", 1),)),
]


def _compilers() -> list:
    return [pytest.param(c, marks=pytest.mark.skipif(shutil.which(c) is None, reason=f"{c} is not installed"))
            for c in ("g++", "clang++")]


def _run(cmd: list, what: str) -> None:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{cmd[0]} rejected {what}:\n{proc.stderr[-4000:]}"


def _compile(cxx: str, path, *extra: str) -> str:
    obj = f"{path}.{cxx}.o"
    _run([cxx, "-std=c++17", *WARNINGS, *extra, "-c", path, "-o", obj], path.name)
    return obj


def test_templates_are_package_data_read_through_importlib_resources():
    folder = resources.files("opsmith.onnx").joinpath("templates")
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == sorted(TEMPLATES)
    for name in TEMPLATES:
        assert template_text(name) == folder.joinpath(name).read_text(encoding="utf-8")
        assert re.findall(r"@[A-Z_]+@", template_text(name)), f"{name} has no placeholder to fill"
    with pytest.raises(SpecError, match="no ONNX Runtime template 'nope.cpp'"):
        template_text("nope.cpp")


def test_pyproject_ships_the_templates():
    """Every template file matches a package-data pattern of opsmith.onnx (so the wheel has it)."""
    import fnmatch
    from pathlib import Path

    import tomllib

    config = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"].get("opsmith.onnx", [])
    for name in TEMPLATES:
        assert any(fnmatch.fnmatch(f"templates/{name}", p) for p in patterns), (name, patterns)


def test_fill_is_one_pass_and_refuses_unknown_placeholders():
    assert fill("a @X@ b", {"X": "@Y@"}) == "a @Y@ b"  # a value is not filled again
    with pytest.raises(SpecError, match="@Y@ has no value"):
        fill("@X@ @Y@", {"X": "1"})


@pytest.mark.parametrize("cxx", _compilers())
def test_cpu_context_header_compiles_alone(cxx, tmp_path):
    header = tmp_path / "cpu_context.h"
    header.write_text(fill(template_text("cpu_context.h"), {"PFV": str(PARALLEL_FOR_API_VERSION)}))
    _compile(cxx, header, "-x", "c++")
    use = tmp_path / "use.cpp"  # instantiate parallel_for, on the calling thread and through a pool
    use.write_text('#include "cpu_context.h"\n'
                   "static void run(const void *, size_t chunks, opsmith::cpu_context::chunk_fn fn, void *data) {\n"
                   "  for (size_t i = 0; i < chunks; ++i) fn(data, i);\n}\n"
                   "long long total(const float *x, long long n, bool pool) {\n"
                   "  opsmith::cpu_context cpu(pool ? run : nullptr, nullptr);\n"
                   "  std::atomic<long long> s{0};\n"
                   "  cpu.parallel_for(n, 100, [&](long long b, long long e) { for (long long i = b; i < e; ++i) "
                   "s += (long long)x[i]; });\n"
                   "  return s.load() + (cpu.has_thread_pool() ? 1 : 0);\n}\n")
    _compile(cxx, use, f"-I{tmp_path}")


@pytest.mark.parametrize("cxx", _compilers())
def test_library_template_compiles_alone_filled_with_cpu_ops(cxx, tmp_path):
    src = tmp_path / "sample_ort.cpp"
    src.write_text(generate_source(SAMPLE_SPECS, cpu_source=SAMPLE_CPU))
    text = src.read_text()
    assert not re.search(r"@[A-Z_]+@", text)
    assert '"sample", "other"' in text and "&op0_cpu, &op1_cpu" in text
    _compile(cxx, src, "-fPIC")


# the CUDA provider's ops call the launch core's functions (opsmith/_runtime/launch/, filled here
# with a sample kernel and a fake image: generating C is not compiling, no NVRTC or GPU needed)
CUDA_SPEC = OrtOpSpec(domain="sample", name="relu", inputs=1, outputs=1, like=(0,), cpu="relu_cpu",
                      items_per_thread=4,
                      variants=(OrtVariant(dtype="float32", c_params=("const float *x", "float *y", "long long n"),
                                           binding=("in0", "out0", "n"), kernel="relu<float>"),
                                OrtVariant(dtype="float64", c_params=("const double *x", "double *y", "long long n"),
                                           binding=("in0", "out0", "n"), kernel="relu<double>")))
CUDA_CPU = "template <typename T> static void relu_cpu(const T *x, T *y, long long n) " \
           "{ for (long long i = 0; i < n; ++i) y[i] = x[i] < T(0) ? T(0) : x[i]; }"


@pytest.mark.parametrize("cxx", _compilers())
def test_library_template_compiles_alone_filled_with_a_cuda_op_and_links_the_launch_core(cxx, tmp_path):
    """The CUDA variant: the template filled with a launch unit's header compiles warning-free, and
    linked with that unit (compiled as C) leaves no symbol undefined: C names on both sides."""
    from opsmith._runtime._launch_gen import LaunchKernel, generate
    from opsmith._runtime._signature import KernelSignature
    cc = {"g++": "gcc", "clang++": "clang"}[cxx]
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} is not installed")
    kernels = [LaunchKernel(f"relu<{t}>", f"relu_{t}", 0, KernelSignature.parse(f"relu<{t}>", f"const {t}* x, "
                                                                                  f"{t}* y, long long n", f"sym_{t}"))
               for t in ("float", "double")]
    unit = generate("sample_k0", kernels, [("sm_90", "cubin")], [[b"not a cubin"]], tool="the ORT template test")
    (tmp_path / "sample_k0.h").write_text(unit.header)
    (tmp_path / "sample_k0.c").write_text(unit.source)
    src = tmp_path / "sample_ort.cpp"
    src.write_text(generate_source([CUDA_SPEC], cpu_source=CUDA_CPU, launch_headers=["sample_k0.h"],
                                   last_error=unit.last_error, launchers=unit.launchers))
    text = src.read_text()
    assert '#include "sample_k0.h"' in text and "grid_for(n, 4)" in text
    assert "opsmith_sample_k0_relu_float_launch(" in text
    glue = _compile(cxx, src, "-fPIC", f"-I{tmp_path}")
    launch = f"{tmp_path}/sample_k0.c.o"
    _run([cc, "-std=gnu17", "-fPIC", "-c", tmp_path / "sample_k0.c", "-o", launch], "sample_k0.c")
    _run([cxx, "-shared", "-Wl,--no-undefined", glue, launch, "-o", tmp_path / "libsample.so", "-ldl", "-lpthread"],
         "the library's link")
