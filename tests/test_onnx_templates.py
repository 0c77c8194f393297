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
  cpu.parallel_for(n, 1024, [=](long long begin, long long end) { for (long long i = begin; i < end; ++i) y[i] = -x[i]; });
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


def _compile(cxx: str, path, *extra: str) -> None:
    proc = subprocess.run([cxx, "-std=c++17", *WARNINGS, *extra, "-c", str(path), "-o", str(path) + ".o"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{cxx} rejected {path.name}:\n{proc.stderr[-4000:]}"


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

    config = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
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
