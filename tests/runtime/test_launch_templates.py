"""The launch core's templates (opsmith/_runtime/launch/): shipped as package data, each filled
from a small sample of kernel signatures and compiled alone as C99 and C++17 with gcc and clang
(a missing compiler is skipped with the reason) at ``-Wall -Wextra -Werror -pedantic``; two
filled libraries with different prefixes link into one program."""
from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from opsmith._errors import SpecError
from opsmith._runtime._launch_gen import (TEMPLATES, LaunchKernel, c_param, fill, fill_sections, generate,
                                          inline_include, template_text)
from opsmith._runtime._signature import KernelSignature

REPO = Path(__file__).resolve().parent.parent.parent
WARNINGS = ["-Wall", "-Wextra", "-Werror", "-pedantic"]
LANGS = {"gcc": ["-x", "c", "-std=c99"], "clang": ["-x", "c", "-std=c99"],
         "g++": ["-x", "c++", "-std=c++17"], "clang++": ["-x", "c++", "-std=c++17"]}

# every kind of parameter the launcher passes: typed and void pointers, a name the launch
# function uses itself (stream), several scalar spellings, and a kernel with no parameter
SAMPLE = [
    ("relu", "relu", 0, "const float* __restrict__ x, float* __restrict__ y, long long n", "relu"),
    ("scale<float>", "scale_f", 0, "float* x, float a, int n", "_Z5scaleIfEvPT_S0_i"),
    ("mix", "mix", 1, "const __half* h, unsigned char* out, int stream, size_t count, bool flag, double w",
     "_Z3mixPK6__halfPhimbd"),
    ("tick", "tick", 1, "", "tick"),
]
ARCHS = [("sm_80", "cubin"), ("sm_90a", "cubin"), ("sm_90", "ptx")]


def _sample(prefix: str = "sample"):
    kernels = [LaunchKernel(name, cname, module, KernelSignature.parse(name, params, symbol))
               for name, cname, module, params, symbol in SAMPLE]
    images = [[bytes(range(a, a + 40)), b"\x00*/\"\\" * 3] for a in range(len(ARCHS))]
    return generate(prefix, kernels, ARCHS, images, tool="the template test")


def _compile(compiler: str, path: Path, *extra: str) -> Path:
    obj = path.with_name(f"{path.name}.{compiler}.o")
    proc = subprocess.run([compiler, *LANGS[compiler], *WARNINGS, *extra, "-c", str(path), "-o", str(obj)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{compiler} rejected {path.name}:\n{proc.stderr[-4000:]}"
    return obj


def _compilers() -> list:
    return [pytest.param(c, marks=pytest.mark.skipif(shutil.which(c) is None, reason=f"{c} is not installed"))
            for c in LANGS]


def test_templates_are_package_data_read_through_importlib_resources():
    folder = resources.files("opsmith._runtime").joinpath("launch")
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == sorted(TEMPLATES)
    for name in TEMPLATES:
        text = template_text(name)
        assert text == folder.joinpath(name).read_text(encoding="utf-8")
        assert "@PREFIX@" in text and ("@HEADER@" in text) == (name != "osm_launch.h")
        assert ("/* @BEGIN_KERNEL@ */" in text) == (name != "osm_driver.h")
    with pytest.raises(SpecError, match="no launch-core template 'nope.c'"):
        template_text("nope.c")


def test_pyproject_ships_the_templates():
    """Every template matches a package-data pattern of opsmith._runtime (so the wheel has it)."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"].get("opsmith._runtime", [])
    for name in TEMPLATES:
        assert any(fnmatch.fnmatch(f"launch/{name}", p) for p in patterns), (name, patterns)


def test_fill_is_one_pass_and_sections_repeat_per_item():
    assert fill("a @X@ b", {"X": "@Y@"}) == "a @Y@ b"  # a value is not filled again
    with pytest.raises(SpecError, match="@Y@ has no value"):
        fill("@X@ @Y@", {"X": "1"})
    text = "top @A@\n/* @BEGIN_K@ */\n[@A@ @B@]\n/* @END_K@ */\nend\n"
    assert fill_sections(text, "K", {"A": "a"}, [{"B": "1"}, {"B": "@A@"}]) == "top a\n[a 1]\n[a @A@]\nend\n"
    with pytest.raises(SpecError, match=r"no /\* @BEGIN_J@ \*/"):
        fill_sections(text, "J", {"A": "a"}, [])
    assert inline_include('a\n#include "x.h"\nb\n', "x.h", "X\n") == "a\nX\nb\n"
    with pytest.raises(SpecError, match='must include "y.h" exactly once'):
        inline_include('#include "x.h"\n', "y.h", "Y\n")


def test_generated_names_tables_and_parameters():
    src = _sample()
    assert src.launchers["scale<float>"] == "opsmith_sample_scale_f_launch"
    assert src.attributes["tick"] == "opsmith_sample_tick_attributes" and src.last_error == "opsmith_sample_last_error"
    assert src.c_params["mix"] == ["const void *h", "unsigned char *out", "int stream_", "size_t count", "bool flag",
                                   "double w"]
    assert src.c_params["tick"] == []
    for text in (src.header, src.source):
        assert not re.search(r"@[A-Z_]+@", text)
    # one file: the driver part written in place of its #include
    assert '#include "osm_driver.h"' not in src.source and "static void osm_drv_open(void)" in src.source
    assert ("opsmith_CUresult opsmith_sample_relu_launch(opsmith_CUstream stream, opsmith_dim3 grid, opsmith_dim3 "
            "block, unsigned shared_mem, const float *x, float *y, long long n);") in src.header
    assert '{"sm_90a", 9, 0, 0, 1, {osm_image_1_0, osm_image_1_1}}' in src.source  # arch-specific: exact
    assert '{"compute_90", 9, 0, 1, 0, {osm_image_2_0, osm_image_2_1}}' in src.source  # PTX
    assert '{"scale<float>", "_Z5scaleIfEvPT_S0_i", 0}' in src.source and '{"tick", "tick", 1}' in src.source
    assert "void *args[] = {NULL};" in src.source and "args, 0);" in src.source  # no parameter: NULL to the driver
    assert "(it has: sm_80, sm_90a, compute_90)" in src.source and '#include "sample.h"' in src.source
    with pytest.raises(SpecError, match="not a C identifier"):
        generate("my-lib", [], ARCHS, [])
    one = [LaunchKernel("relu", "relu", 0, KernelSignature.parse("relu", "float* x"))]
    with pytest.raises(SpecError, match="one image per module"):
        generate("lib", one, ARCHS, [[b"x"]])


def test_c_param_maps_types_a_c_compiler_knows():
    sig = KernelSignature.parse("k", "const float4* __restrict__ v, const int32_t n, unsigned long long m, "
                                     "int64_t* idx, char c, float f[4]")
    used: set[str] = set()
    assert [c_param(p, used) for p in sig.params] == ["const void *v", "int32_t n", "unsigned long long m",
                                                     "int64_t *idx", "char c", "float *f_"]


# A unit of each template: the source is its own; a header is compiled through a unit that
# includes it (as the main file, clang flags a static inline helper every includer may use) and,
# for the driver part, calls its entry points (its functions are static: unused, they warn).
UNITS = {
    "osm_launch.h": '#include "sample.h"\n',
    "osm_driver.h": '#include "osm_driver.h"\n'
                    "int main(void) {\n"
                    "    void *fn = NULL;\n"
                    "    opsmith_CUresult r = osm_driver();\n"
                    '    if (r == OSM_SUCCESS) r = osm_proc("cuInit", &fn);\n'
                    '    if (r != OSM_SUCCESS) osm_fail(r, "sample %d", 1);\n'
                    '    return osm_last[0] != 0;\n'
                    "}\n",
}


@pytest.mark.parametrize("compiler", _compilers())
@pytest.mark.parametrize("template", TEMPLATES)
def test_each_template_compiles_alone_filled_with_a_sample(template, compiler, tmp_path):
    src = _sample()
    (tmp_path / "sample.h").write_text(src.header)
    values = {"PREFIX": "sample", "HEADER": "sample.h"}
    (tmp_path / "osm_driver.h").write_text(fill(template_text("osm_driver.h"), values))
    path = tmp_path / f"unit_{template.replace('.', '_')}.c"
    path.write_text(src.source if template == "osm_launch.c" else UNITS[template])
    _compile(compiler, path, f"-I{tmp_path}")


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
def test_two_libraries_link_into_one_program(tmp_path):
    """Every internal name is static, every public one prefixed: two libraries, one program."""
    objs = []
    for prefix in ("one", "two"):
        src = _sample(prefix)
        (tmp_path / f"{prefix}.h").write_text(src.header)
        (tmp_path / f"{prefix}.c").write_text(src.source)
        objs.append(_compile("gcc", tmp_path / f"{prefix}.c", f"-I{tmp_path}", "-fPIC"))
    main = tmp_path / "main.c"
    main.write_text('#include <stdio.h>\n#include "one.h"\n#include "two.h"\nint main(void) {\n'
                    '    printf("%s|%s|%d\\n", opsmith_one_error_string(1), opsmith_two_error_string(500),\n'
                    '           OPSMITH_ONE_NUM_KERNELS + OPSMITH_TWO_NUM_KERNELS);\n    return 0;\n}\n')
    exe = tmp_path / "main"
    proc = subprocess.run(["gcc", "-std=c99", *WARNINGS, f"-I{tmp_path}", str(main), *map(str, objs), "-o", str(exe),
                           "-ldl", "-lpthread"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60).stdout.strip()
    assert out == ("CUDA_ERROR_INVALID_VALUE (1): the CUDA driver is not loaded to describe it|"
                   "CUDA_ERROR_NOT_FOUND (500): the CUDA driver is not loaded to describe it|8")
