"""The C-shim op library's source (opsmith/_torch/cshim/osm_cshim.cpp) as a real file: shipped as
package data and found through importlib.resources, compiled alone as C++17 by g++ and clang++
(a missing compiler is skipped with the reason) at ``-Wall -Wextra -Werror -pedantic``, and the
limits and function order Python reads from it agree with what the compiled library reports."""
from __future__ import annotations

import ctypes
import fnmatch
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from opsmith._errors import OpsmithError
from opsmith._torch import _cshim_source

REPO = Path(__file__).resolve().parent.parent.parent
FLAGS = ["-x", "c++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-pedantic"]
COMPILERS = [pytest.param(c, marks=pytest.mark.skipif(shutil.which(c) is None, reason=f"{c} is not installed"))
             for c in ("g++", "clang++")]

# the order of osm_init's table since the library exists (the C-shim tests register through it)
API_NAMES = (
    "aoti_torch_library_init_impl", "aoti_torch_library_impl", "aoti_torch_get_data_ptr",
    "aoti_torch_get_numel", "aoti_torch_get_dim", "aoti_torch_get_sizes", "aoti_torch_get_dtype",
    "aoti_torch_get_device_type", "aoti_torch_get_device_index", "aoti_torch_is_contiguous",
    "aoti_torch_empty_strided", "aoti_torch_copy_", "aoti_torch_delete_tensor_object",
    "aoti_torch_get_current_cuda_stream", "cuLaunchKernel", "cuCtxGetDevice", "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
)


def _source_path() -> Path:
    return REPO / "opsmith" / "_torch" / _cshim_source.RESOURCE


def test_source_is_package_data_read_through_importlib_resources():
    found = resources.files(_cshim_source.PACKAGE).joinpath(_cshim_source.RESOURCE)
    assert found.is_file()
    src = _cshim_source.read()
    assert src.text == found.read_text(encoding="utf-8") == _source_path().read_text(encoding="utf-8")
    assert "%" not in src.text.replace('"%s"', "")  # no Python formatting left in the C++


def test_pyproject_ships_the_source():
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"].get(_cshim_source.PACKAGE, [])
    assert any(fnmatch.fnmatch(_cshim_source.RESOURCE, p) for p in patterns), patterns


def test_python_reads_the_limits_and_the_api_order_from_the_file():
    src = _cshim_source.read()
    assert (src.max_ops, src.max_kernels, src.max_params, src.max_devices, src.max_tensors) == (64, 8, 24, 16, 16)
    assert src.api_names == API_NAMES


def test_a_source_without_its_declarations_is_a_clear_error():
    text = _cshim_source.read().text
    with pytest.raises(OpsmithError, match=r"defines no OSM_MAX_PARAMS; reinstall opsmith"):
        _cshim_source.parse(text.replace("#define OSM_MAX_PARAMS", "#define OSM_PARAMS"))
    with pytest.raises(OpsmithError, match=r"has no OSM_API\(X\) list.*OPSMITH_TORCH_OP_CSHIM=0"):
        _cshim_source.parse(text.replace("#define OSM_API(X)", "#define OSM_FUNCTIONS(X)"))


@pytest.mark.parametrize("compiler", COMPILERS)
def test_source_compiles_alone(compiler, tmp_path):
    obj = tmp_path / f"osm_cshim.{compiler}.o"
    proc = subprocess.run([compiler, *FLAGS, "-fPIC", "-c", str(_source_path()), "-o", str(obj)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"{compiler} rejected osm_cshim.cpp:\n{proc.stderr[-4000:]}"
    assert obj.stat().st_size > 0


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_compiled_library_agrees_with_what_python_read(tmp_path):
    """The table osm_init copies and the op slots are the ones Python reads from the file."""
    so = tmp_path / "osm_cshim_check.so"
    proc = subprocess.run(["g++", *FLAGS, "-fPIC", "-shared", "-fvisibility=hidden", str(_source_path()),
                           "-o", str(so)], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lib = ctypes.CDLL(str(so))
    src = _cshim_source.read()
    assert lib.osm_api_count() == len(src.api_names)
    assert lib.osm_max_ops() == src.max_ops
    assert lib.osm_abi() == 2
