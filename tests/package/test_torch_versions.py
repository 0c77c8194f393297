"""Packages across torch versions (issue 21): the tutorial's ReLU package and an opsmith.ops
package, built here once, installed into a fresh venv per torch version (the oldest opsmith
supports and the newest, whose C shim the op library uses), each checked in a process with
no compiler on PATH and NVRTC unimportable: import, schemas, CPU implementations, autograd, fake
kernels, opcheck, opsmith.ops on CPU against torch, the packaged kernels served, zero compiles.

The versions: ``OPSMITH_TEST_TORCH_VERSIONS`` (comma-separated; empty: none). Unset: 2.4.1, the oldest, in the
default run (about 150-190 s on the 2-core CI machine, most of it pip), and 2.14.1, the newest pip installs here
(2.15.0: pip's "ResolutionImpossible" on this Python 3.11, 2026-12-05), marked slow (``python -m pytest -m slow``);
2.8.0, the first with the C shim, passed here. A version pip cannot install here skips with pip's reason. Each venv
(torch with its CUDA libraries, ~5 GB) is removed after its test.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("cuda.bindings.nvrtc")

from opsmith.ops import _sources  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CHECK = Path(__file__).with_name("installed_check.py")
# the oldest in the default run, the newest marked slow (`-m slow`); the variable's versions, if set, in either run
_ENV = os.environ.get("OPSMITH_TEST_TORCH_VERSIONS")
VERSIONS = ([v for v in _ENV.split(",") if v] if _ENV is not None
            else ["2.4.1", pytest.param("2.14.1", marks=pytest.mark.slow)])

pytestmark = pytest.mark.timeout(1800)

# opsmith.ops in the venv's torch: values against torch's functions on CPU, opcheck, the ops
# package's kernels loaded for sm_90 with NVRTC blocked
_OPS_CHECK = r'''
import json, sys
exec(open(sys.argv[1]).read().split("def main")[0])  # installed_check's _NoNvrtc
sys.meta_path.insert(0, _NoNvrtc())
import torch
import torch.nn.functional as F
import opsmith.ops as O
from opsmith._build import _nvrtc, _prebuilt
from opsmith._torch._cuda_module import CudaModule
from opsmith.ops import _sources
x = torch.randn(37, 130, dtype=torch.float32)
w = torch.randn(130)
b = torch.randn(130)
ok = {
    "relu": torch.equal(O.relu(x), torch.relu(x)),
    "gelu": torch.allclose(O.gelu(x), F.gelu(x), atol=1e-6),
    "softmax": torch.allclose(O.softmax(x), torch.softmax(x, -1), atol=1e-6),
    "layer_norm": torch.allclose(O.layer_norm(x, [130], w, b), F.layer_norm(x, [130], w, b), atol=1e-5),
    "rms_norm": torch.allclose(O.rms_norm(x, [130], w, 1e-6), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
                               atol=1e-5),
}
xg = x.clone().requires_grad_()
O.layer_norm(xg, [130], w, b).sum().backward()
ok["layer_norm_grad"] = bool(torch.isfinite(xg.grad).all())
if hasattr(torch.library, "opcheck"):
    torch.library.opcheck(torch.ops.opsmith.softmax.default, (x, -1))
    ok["opcheck"] = True
mods = [CudaModule(_sources.KERNEL_DIR / f, name_expressions=_sources.kernel_names(f, d), arch="sm_90",
                   name=f"opsmith/ops/kernels/{f}") for f in _sources.FILES for d in _sources.DTYPES]
print(json.dumps({"torch": torch.__version__, "ok": {k: bool(v) for k, v in ok.items()}, "programs": len(mods),
                  "compiles": _nvrtc.nvrtc_stats["compiles"], "served": _prebuilt.prebuilt_stats["kernels"]}))
'''


@pytest.fixture(scope="module")
def wheels(relu_package, ops_package):
    """The ReLU package (sm_80, sm_90) and opsmith.ops' kernels (sm_90), built with this torch (tests/conftest.py's)."""
    return [relu_package["out"]["wheel"], ops_package["wheel"]]


def _venv(path: Path, version: str) -> Path:
    """A fresh venv holding torch ``version`` and opsmith's dependencies (opsmith itself comes
    from this checkout through PYTHONPATH)."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, capture_output=True, timeout=300)
    py = path / "bin" / "python"
    try:
        r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"torch=={version}",
                            "numpy", "filelock>=3.12", "ninja>=1.11", "rich>=13"],
                           capture_output=True, text=True, timeout=1200, check=False)
        why = None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["(no output)"])[-1]
    except subprocess.TimeoutExpired:
        why = "pip did not finish in 20 minutes (the index or the network is slow)"
    if why is not None:
        shutil.rmtree(path, ignore_errors=True)
        pytest.skip(f"torch=={version} cannot be installed here: {why}")
    return py


@pytest.mark.parametrize("version", VERSIONS)
def test_packages_on_torch_version(version, wheels, tmp_path):
    venv = tmp_path / "venv"
    try:
        py = _venv(venv, version)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", *wheels], check=True,
                       capture_output=True, timeout=300)
        bin_dir = tmp_path / "nobin"  # no cc, c++, nvcc: only the venv's python, by its path
        bin_dir.mkdir()
        env = {k: v for k, v in os.environ.items() if k not in ("OPSMITH_CUDA_ARCH", "CC", "CXX", "CUDA_HOME")}
        env.update(PATH=str(bin_dir), PYTHONPATH=str(ROOT), OPSMITH_CACHE_DIR=str(tmp_path / "cache"))
        r = subprocess.run([str(py), str(CHECK), "relupkg", "--block-nvrtc"], cwd=tmp_path, capture_output=True,
                           text=True, env=env, timeout=300, check=False)
        assert r.returncode == 0, r.stdout + r.stderr
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert got["torch"].split("+")[0] == version
        assert got["ops"] == {"relupkg::relu": "relu(Tensor x) -> Tensor",
                              "relupkg::relu_backward": "relu_backward(Tensor grad, Tensor x) -> Tensor"}
        assert got["cpu_ok"] and got["fake_ok"] and got.get("opcheck") == "passed", got
        assert got["nvrtc"]["compiles"] == 0 and got["prebuilt"]["kernels"] >= 1, got
        assert got["module"].startswith(str(venv))
        script = tmp_path / "ops_check.py"
        script.write_text(_OPS_CHECK)
        r = subprocess.run([str(py), str(script), str(CHECK)], cwd=tmp_path, capture_output=True, text=True,
                           env=env, timeout=600, check=False)
        assert r.returncode == 0, r.stdout + r.stderr
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert all(got["ok"].values()) and got["ok"].get("opcheck"), got
        programs = len(_sources.FILES) * len(_sources.DTYPES)  # every (file, dtype) of opsmith.ops
        assert got["programs"] == programs and got["compiles"] == 0 and got["served"] >= programs, got
    finally:
        shutil.rmtree(venv, ignore_errors=True)
