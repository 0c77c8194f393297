"""CUDA extensions on a GPU: the tutorial's project through JIT and setuptools, load_inline
with cuda_sources, a multi-arch build; results against torch on random data, outputs poisoned.

The tests of this file share one cache directory (module-scoped) so that the precompiled
torch header is built once for all of them, not once per test (~15 s each with gcc).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
import opsmith  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tutorial_relu"


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cuda-cache")


@pytest.fixture
def cache(shared_cache, monkeypatch):
    monkeypatch.setenv("OPSMITH_CACHE_DIR", str(shared_cache))
    from opsmith._cache._open import reset
    reset()
    return shared_cache


def _project(tmp_path: Path) -> Path:
    d = tmp_path / "myrelu"
    shutil.copytree(EXAMPLE, d)
    # a unique comment: each test compiles its own objects instead of reusing another test's
    nonce = uuid.uuid4().hex
    for name in ("relu.cpp", "relu_kernel.cu"):
        p = d / name
        p.write_text(p.read_text() + f"\n// {nonce}\n")
    return d


def _check_relu(fn, sizes=(1, 255, 256, 257, 100_003)) -> None:
    for n in sizes:
        x = torch.randn(n, device="cuda")
        y = fn(x)
        torch.cuda.synchronize()
        assert y.shape == x.shape and y.device == x.device
        assert torch.equal(y, torch.relu(x)), f"wrong result for n={n}"


def test_tutorial_project_through_jit_load(cache, tmp_path):
    d = _project(tmp_path)
    m = opsmith.load("myrelu", [str(d / "relu.cpp"), str(d / "relu_kernel.cu")])
    _check_relu(m.relu)
    # warm: same sources, no compile
    art = opsmith.build("myrelu", [str(d / "relu.cpp"), str(d / "relu_kernel.cu")])
    assert not art.built


def test_tutorial_project_through_setuptools_build_ext_inplace(cache, tmp_path):
    d = _project(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(opsmith.__file__).parent.parent),
                                                        os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=d, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    built = list(d.glob("myrelu*.so"))
    assert built, r.stdout[-2000:]
    r = subprocess.run([sys.executable, "test.py"], cwd=d, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "correct: True" in r.stdout
    # poisoned outputs and random sizes, in this process, by importing the built module
    sys.path.insert(0, str(d))
    try:
        import importlib
        myrelu = importlib.import_module("myrelu")
        _check_relu(myrelu.relu)
        assert myrelu.__name__ == "myrelu"
    finally:
        sys.path.remove(str(d))
        sys.modules.pop("myrelu", None)
    # a second build_ext in the same tree compiles nothing
    r = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=d, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0 and "nothing compiled" in r.stdout, r.stdout[-2000:]


CUDA_SRC = r"""
__global__ void scale_kernel(const float* __restrict__ x, float* __restrict__ y, float a, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
torch::Tensor scale(torch::Tensor x, double a) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "x must be a float CUDA tensor");
    auto y = torch::full_like(x, std::nanf(""));   // poisoned: every element must be written
    int64_t n = x.numel();
    int threads = 256;
    int64_t blocks = (n + threads - 1) / threads;
    scale_kernel<<<blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), (float)a, n);
    return y;
}
"""


def test_load_inline_with_cuda_sources(cache):
    m = opsmith.load_inline("scale_ext", "torch::Tensor scale(torch::Tensor x, double a);",
                            cuda_sources=CUDA_SRC + f"// {uuid.uuid4().hex}\n", functions=["scale"])
    for n in (1, 1000, 1 << 20):
        x = torch.randn(n, device="cuda")
        y = m.scale(x, 2.5)
        torch.cuda.synchronize()
        assert not torch.isnan(y).any()
        assert torch.allclose(y, x * 2.5)


def test_multi_arch_fat_binary(cache, tmp_path, monkeypatch):
    cap = torch.cuda.get_device_capability()
    here = f"{cap[0]}.{cap[1]}"
    other = "8.0" if here != "8.0" else "9.0"
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", f"{other};{here}+PTX")
    d = _project(tmp_path)
    art = opsmith.build("myrelu_fat", [str(d / "relu.cpp"), str(d / "relu_kernel.cu")])
    m = opsmith.load_artifact(art)
    _check_relu(m.relu)
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:
        out = subprocess.run([cuobjdump, "--list-elf", "--list-ptx", str(art.path)], capture_output=True,
                             text=True).stdout
        num = here.replace(".", "")
        assert f"sm_{other.replace('.', '')}" in out and f"sm_{num}" in out, out


def test_arch_the_gpu_cannot_run_that_is_a_cuda_version_fails_before_nvcc(cache, tmp_path, monkeypatch):
    cap = torch.cuda.get_device_capability()
    if cap == (12, 0):
        pytest.skip("this GPU is compute capability 12.0 itself")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "12.0")
    d = _project(tmp_path)
    with pytest.raises(opsmith.OpsmithError, match="CUDA version"):
        opsmith.build("myrelu_bad", [str(d / "relu.cpp"), str(d / "relu_kernel.cu")])
