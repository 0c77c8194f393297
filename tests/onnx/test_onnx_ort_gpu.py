"""opsmith ops in ONNX Runtime on the CUDA provider (onnxruntime-gpu): the library's CUDA kernel
runs on ORT's compute stream with inputs and outputs bound to CUDA tensors, bitwise equal to the
torch op (the same NVRTC kernel). Skipped with the reason without a GPU or a usable CUDA provider."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import opsmith  # noqa: E402
import opsmith.onnx  # noqa: E402

pytestmark = pytest.mark.gpu

RELU_SRC = r"""
template <typename T> __global__ void relu_fwd(const T* x, T* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > T(0) ? x[i] : T(0); }
"""


def _ort_cuda():
    try:
        import onnxruntime as ort
    except ImportError:
        pytest.skip("onnxruntime is not installed (pip install onnxruntime-gpu)")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip(f"onnxruntime {ort.__version__} has no CUDA provider (install onnxruntime-gpu, the CUDA build "
                    f"matching the driver)")
    pytest.importorskip("onnxscript")
    return ort


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    ort = _ort_cuda()
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    root = tmp_path_factory.mktemp("ortgpu")
    major, minor = torch.cuda.get_device_capability()
    mod = opsmith.CudaModule(RELU_SRC, name_expressions=["relu_fwd<float>", "relu_fwd<double>"])
    relu = opsmith.custom_op("ortgpu::relu", kernel=[mod.get_kernel("relu_fwd<float>"),
                                                     mod.get_kernel("relu_fwd<double>")])
    # CUDA only: a session that runs at all ran the node on the CUDA provider
    lib = opsmith.onnx.build_library([relu], name="ortgpu_relu", archs=[f"sm_{major}{minor}"], out_dir=root / "lib")

    class Plain(torch.nn.Module):
        def forward(self, x):
            return relu(x)

    paths = {}
    for dt in (torch.float32, torch.float64):
        paths[dt] = root / f"relu_{dt}.onnx"
        opsmith.onnx.export(Plain(), (torch.randn(4, 8, dtype=dt),), paths[dt],
                            dynamic_shapes=({0: torch.export.Dim("batch")},))
    return ort, relu, lib, paths


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_round_trip_io_binding_bitwise(setup, dtype):
    ort, relu, lib, paths = setup
    sess = opsmith.onnx.inference_session(paths[dtype], lib, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert sess.get_providers()[0] == "CUDAExecutionProvider", sess.get_providers()
    npdt = np.float32 if dtype == torch.float32 else np.float64
    for rows in (1, 37, 1 << 14):
        x = torch.randn(rows, 8, dtype=dtype, device="cuda")
        y = torch.full_like(x, float("nan"))
        io = sess.io_binding()
        io.bind_input(sess.get_inputs()[0].name, "cuda", 0, npdt, tuple(x.shape), x.data_ptr())
        io.bind_output(sess.get_outputs()[0].name, "cuda", 0, npdt, tuple(y.shape), y.data_ptr())
        torch.cuda.synchronize()
        sess.run_with_iobinding(io)
        torch.cuda.synchronize()
        want = relu(x)
        bits = torch.int32 if dtype == torch.float32 else torch.int64
        assert torch.equal(y.view(bits), want.view(bits))


def test_cuda_round_trip_host_arrays(setup):
    ort, relu, lib, paths = setup
    sess = opsmith.onnx.inference_session(paths[torch.float32], lib, providers=["CUDAExecutionProvider"])
    x = torch.randn(300, 8)
    out = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    assert np.array_equal(out.view(np.int32), relu(x.cuda()).cpu().numpy().view(np.int32))


def test_cuda_only_library_refused_for_cpu_sessions(setup):
    ort, relu, lib, paths = setup
    with pytest.raises(opsmith.OpsmithError, match="CPUExecutionProvider.*CUDAExecutionProvider"):
        opsmith.onnx.inference_session(paths[torch.float32], lib, providers=["CPUExecutionProvider"])


def test_doctor_cuda_provider_row(setup):
    from opsmith.onnx._doctor import doctor_rows
    from opsmith._config import settings
    rows = {r[0]: r for r in doctor_rows(settings.cache_path)}
    assert rows["ORT CUDA provider"][1] in ("ok", "warning")
    if rows["ORT CUDA provider"][1] == "warning":
        assert rows["ORT CUDA provider"][3]
