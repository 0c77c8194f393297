"""opsmith ops in ONNX Runtime, CPU provider: build the custom-op library (real NVRTC, real
gcc), export a model with torch.onnx.export (dynamo and TorchScript), run ORT sessions
(the installed, newest ORT in process; the oldest pip-installable one in a subprocess),
the OrtApi offsets against the real library, error texts, the doctor rows.

The oldest ORT is looked for in $ORT_OLD_TARGET (a pip --target dir), else
/tmp/opsmith-ort-1.15.0, which this test fills with `pip install --target` (skipped with the
reason when pip cannot install it, e.g. offline).
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxscript")
torch = pytest.importorskip("torch")

import opsmith  # noqa: E402
import opsmith.onnx  # noqa: E402
from opsmith._build._ort_lib import ORT_API_INDEX, ORT_API_VERSION  # noqa: E402

OLD_ORT = "1.15.0"  # the oldest onnxruntime pip installs for Python 3.11
RELU_SRC = r"""
template <typename T> __global__ void relu_fwd(const T* x, T* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > T(0) ? x[i] : T(0); }
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The ReLU op (float and double kernels) and two libraries: with and without a CPU function."""
    root = tmp_path_factory.mktemp("ort")
    old = os.environ.get("OPSMITH_CACHE_DIR")
    os.environ["OPSMITH_CACHE_DIR"] = str(root / "cache")
    try:
        mod = opsmith.CudaModule(RELU_SRC, name_expressions=["relu_fwd<float>", "relu_fwd<double>"], arch="sm_90")
        relu = opsmith.custom_op("ortlib::relu", kernel=[mod.get_kernel("relu_fwd<float>"),
                                                         mod.get_kernel("relu_fwd<double>")],
                                 cpu=lambda x: x.clamp_min(0))
        lib = opsmith.onnx.build_library([relu], cpu_source=opsmith.onnx.RELU_CPU_SOURCE,
                                         cpu={"ortlib::relu": "relu_cpu"}, archs=["sm_90"], out_dir=root / "lib")
        cuda_only = opsmith.onnx.build_library([relu], name="relu_cuda_only", archs=["sm_90"],
                                               out_dir=root / "lib_cuda")
    finally:
        if old is None:
            os.environ.pop("OPSMITH_CACHE_DIR", None)
        else:
            os.environ["OPSMITH_CACHE_DIR"] = old

    class Model(torch.nn.Module):
        def forward(self, x):
            return relu(x * 3.0) - 1.0

    model = Model()
    path = root / "model.onnx"
    opsmith.onnx.export(model, (torch.randn(4, 33),), path, dynamo=True,
                        dynamic_shapes=({0: torch.export.Dim("batch")},))
    portable = root / "model_opset18_ir9.onnx"  # what ORT 1.15 reads (IR <= 9, opset <= 19)
    opsmith.onnx.export(model, (torch.randn(4, 33),), portable, opset_version=18, ir_version=9,
                        dynamic_shapes=({0: torch.export.Dim("batch")},))
    return {"root": root, "relu": relu, "lib": lib, "cuda_only": cuda_only, "model": model, "path": path,
            "portable": portable}


def test_library_links_no_onnxruntime(built):
    lib = built["lib"]
    out = subprocess.run(["readelf", "-d", str(lib.path)], capture_output=True, text=True).stdout
    assert "onnxruntime" not in out
    syms = subprocess.run(["nm", "-D", "--defined-only", str(lib.path)], capture_output=True, text=True).stdout
    assert "RegisterCustomOps" in syms
    manifest = json.loads(lib.manifest.read_text())
    assert manifest["ort_api_version"] == ORT_API_VERSION
    assert manifest["ops"]["ortlib.relu"]["providers"] == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert built["cuda_only"].ops["ortlib.relu"]["providers"] == ["CUDAExecutionProvider"]
    source = (lib.path.parent / "opsmith_ops_ort.cpp").read_text()
    assert "onnxruntime_c_api.h\"" not in source and "#include <onnxruntime" not in source


def test_dynamo_export_emits_the_op_node(built):
    m = onnx.load(str(built["path"]))
    nodes = [(n.domain, n.op_type) for n in m.graph.node]
    assert ("ortlib", "relu") in nodes
    assert {o.domain: o.version for o in m.opset_import}.get("ortlib") == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_round_trip_equals_eager(built, dtype):
    relu = built["relu"]
    path = built["root"] / f"relu_{dtype}.onnx"

    class Plain(torch.nn.Module):
        def forward(self, x):
            return relu(x)

    x = torch.randn(5, 7, dtype=dtype)
    opsmith.onnx.export(Plain(), (x,), path, dynamo=True)
    sess = opsmith.onnx.inference_session(path, built["lib"], providers=["CPUExecutionProvider"])
    out = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    assert out.dtype == x.numpy().dtype
    assert np.array_equal(out, relu(x).numpy())
    # the model with dynamic batch, several sizes (and an empty one)
    sess = opsmith.onnx.inference_session(built["path"], built["lib"])
    for n in (1, 3, 1000, 0):
        x = torch.randn(n, 33)
        out = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
        assert out.shape == (n, 33)
        assert np.array_equal(out, built["model"](x).numpy())


def test_torchscript_export(built):
    relu = built["relu"]

    class Plain(torch.nn.Module):
        def forward(self, x):
            return relu(x) + 1.0

    path = built["root"] / "ts.onnx"
    x = torch.randn(6, 4)
    opsmith.onnx.export(Plain(), (x,), path, dynamo=False, input_names=["x"])
    m = onnx.load(str(path))
    assert ("ortlib", "relu") in [(n.domain, n.op_type) for n in m.graph.node]
    sess = opsmith.onnx.inference_session(path, built["lib"])
    assert np.array_equal(sess.run(None, {"x": x.numpy()})[0], Plain()(x).numpy())


def test_session_options_register_on_given_options(built):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    assert opsmith.onnx.session_options(built["lib"], so) is so
    sess = ort.InferenceSession(str(built["path"]), so, providers=["CPUExecutionProvider"])
    x = torch.randn(2, 33)
    assert np.array_equal(sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0], built["model"](x).numpy())
    # by path too (the manifest lies beside the .so)
    assert opsmith.onnx.load_library(built["lib"].path).ops == built["lib"].ops


def test_no_implementation_for_the_providers_names_op_and_providers(built):
    with pytest.raises(opsmith.OpsmithError) as exc:
        opsmith.onnx.inference_session(built["path"], built["cuda_only"], providers=["CPUExecutionProvider"])
    msg = str(exc.value)
    assert "ortlib.relu" in msg and "CPUExecutionProvider" in msg and "CUDAExecutionProvider" in msg
    assert "cpu_source" in msg
    # ORT's own refusal (the check bypassed: plain ORT with the CUDA-only library)
    so = opsmith.onnx.session_options(built["cuda_only"])
    with pytest.raises(Exception, match="Could not find an implementation|is not a registered function/op"):
        ort.InferenceSession(str(built["path"]), so, providers=["CPUExecutionProvider"])
    # ...which inference_session turns into the same kind of message when its own check cannot see it
    from opsmith._onnx import _session
    real = _session.check_providers
    _session.check_providers = lambda *a: None
    try:
        with pytest.raises(opsmith.OpsmithError, match="no implementation of op relu .*CPUExecutionProvider.*"
                                                       "CUDAExecutionProvider"):
            opsmith.onnx.inference_session(built["path"], built["cuda_only"], providers=["CPUExecutionProvider"])
    finally:
        _session.check_providers = real


def test_library_without_the_op(built, tmp_path):
    other = opsmith.custom_op("ortlib::other_op", schema="(Tensor x) -> Tensor", cpu=lambda x: x + 1)
    lib = opsmith.onnx.build_library([other], cpu_source="template <typename T> void plus1(const T *x, T *y, "
                                     "long long n) { for (long long i = 0; i < n; ++i) y[i] = x[i] + T(1); }",
                                     cpu={"ortlib::other_op": "plus1"}, out_dir=tmp_path / "o")
    with pytest.raises(opsmith.OpsmithError, match="does not have"):
        opsmith.onnx.inference_session(built["path"], lib)
    # an op without a kernel runs on the CPU from its C++ function alone
    path = tmp_path / "plus.onnx"

    class Plus(torch.nn.Module):
        def forward(self, x):
            return other(x)

    x = torch.randn(10)
    opsmith.onnx.export(Plus(), (x,), path)
    sess = opsmith.onnx.inference_session(path, lib)
    assert np.array_equal(sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0], (x + 1).numpy())


def test_spec_errors(built):
    with pytest.raises(opsmith.SpecError, match="no cpu_source"):
        opsmith.onnx.build_library([built["relu"]], cpu={"ortlib::relu": "relu_cpu"})
    scal = opsmith.custom_op("ortlib::scale", schema="(Tensor x, float a) -> Tensor", cpu=lambda x, a: x * a)
    with pytest.raises(opsmith.SpecError, match="attribute"):
        opsmith.onnx.build_library([scal])
    with pytest.raises(opsmith.SpecError, match="not among the ops"):
        opsmith.onnx.build_library([built["relu"]], cpu_source="x", cpu={"ortlib::nope": "f"})


def test_ort_api_offsets_against_the_real_library():
    """The OrtApi entries at our indices behave as the functions we name (newest ORT's libonnxruntime)."""
    capi = Path(ort.__file__).parent / "capi"
    libs = sorted(capi.glob("libonnxruntime.so*"))
    if not libs:
        pytest.skip(f"onnxruntime {ort.__version__} ships no libonnxruntime.so to open")
    lib = ctypes.CDLL(str(libs[0]))
    lib.OrtGetApiBase.restype = ctypes.POINTER(ctypes.c_void_p * 2)
    base = lib.OrtGetApiBase().contents
    get_api = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_uint32)(base[0])
    table = ctypes.cast(get_api(ORT_API_VERSION), ctypes.POINTER(ctypes.c_void_p))
    assert table, f"ORT {ort.__version__} refused API version {ORT_API_VERSION}"
    fn = lambda name, res, *args: ctypes.CFUNCTYPE(res, *args)(table[ORT_API_INDEX[name]])  # noqa: E731
    st = fn("CreateStatus", ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)(2, b"opsmith offset check")
    assert fn("GetErrorCode", ctypes.c_int, ctypes.c_void_p)(st) == 2
    assert fn("GetErrorMessage", ctypes.c_char_p, ctypes.c_void_p)(st) == b"opsmith offset check"
    fn("ReleaseStatus", None, ctypes.c_void_p)(st)
    dom = ctypes.c_void_p()
    assert fn("CreateCustomOpDomain", ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
        b"opsmith_probe", ctypes.byref(dom)) is None and dom.value
    # ReleaseCustomOpDomain sits at 101 (ORT pins it with a static_assert); release through it
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(table[101])(dom)
    # a tensor's type and shape through our GetTensorTypeAndShape/GetDimensions*/GetTensorElementType
    # happen in every round trip above; the CUDA stream entry (193) in tests/test_onnx_ort_gpu.py


def _old_ort_dir() -> Path:
    given = os.environ.get("ORT_OLD_TARGET")
    target = Path(given) if given else Path(f"/tmp/opsmith-ort-{OLD_ORT}")
    if not (target / "onnxruntime").is_dir():
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(target),
                               f"onnxruntime=={OLD_ORT}", "numpy<2"], capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            pytest.skip(f"cannot pip install onnxruntime=={OLD_ORT} into {target}: "
                        f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    return target


_RUN_IN_SUBPROCESS = r"""
import sys, numpy as np, onnxruntime as ort
lib, model, x, want = sys.argv[1:5]
so = ort.SessionOptions()
so.register_custom_ops_library(lib)
sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
out = sess.run(None, {sess.get_inputs()[0].name: np.load(x)})[0]
print(ort.__version__, bool(np.array_equal(out, np.load(want))))
"""


@pytest.mark.parametrize("which", ["oldest", "newest"])
def test_one_library_on_oldest_and_newest_ort(built, which, tmp_path):
    env = dict(os.environ)
    if which == "oldest":
        env["PYTHONPATH"] = str(_old_ort_dir())
    x = torch.randn(8, 33)
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "want.npy", built["model"](x).numpy())
    model = built["portable"] if which == "oldest" else built["path"]
    proc = subprocess.run([sys.executable, "-c", _RUN_IN_SUBPROCESS, str(built["lib"].path), str(model),
                           str(tmp_path / "x.npy"), str(tmp_path / "want.npy")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    version, equal = proc.stdout.split()
    assert equal == "True"
    assert version == (OLD_ORT if which == "oldest" else ort.__version__)


def test_doctor_rows(built, fresh_cache):
    from opsmith._onnx._session import doctor_rows
    rows = {r[0]: r for r in doctor_rows(fresh_cache)}
    assert rows["ONNX Runtime"][1] == "ok" and ort.__version__ in rows["ONNX Runtime"][2]
    assert "CPUExecutionProvider" in rows["ONNX Runtime"][2]
    assert "none built yet" in rows["opsmith ORT op library"][2]
    # a library built into the cache is found and loads
    opsmith.onnx.build_library([built["relu"]], cpu_source=opsmith.onnx.RELU_CPU_SOURCE,
                               cpu={"ortlib::relu": "relu_cpu"}, archs=["sm_90"])
    rows = [r for r in doctor_rows(fresh_cache) if r[0] == "opsmith ORT op library"]
    assert len(rows) == 1 and rows[0][1] == "ok" and rows[0][2].endswith("loads")
    # a broken one is a problem row
    bad = fresh_cache / "ort" / "broken-0" / "libbroken.so"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not an ELF file")
    rows = [r for r in doctor_rows(fresh_cache) if "broken" in r[2]]
    assert rows and rows[0][1] == "problem" and rows[0][3]


def test_doctor_missing_cuda_library_fix():
    from opsmith._onnx._session import _missing_library_fix
    found, fix = _missing_library_fix("libcudnn.so.9: cannot open shared object file: No such file or directory")
    assert found == "libcudnn.so.9 cannot be loaded" and "cuDNN 9" in fix
    found, fix = _missing_library_fix("libcudart.so.13: cannot open shared object file")
    assert "CUDA runtime" in fix


def test_doctor_has_the_onnx_section():
    from opsmith.cli import _doctor
    assert _doctor.check_onnxruntime in _doctor.CHECKS


def test_items_per_thread_sets_the_grid_of_the_cuda_launch(built):
    """A kernel that handles K items per thread gets ceil(n / (256 K)) blocks, as config_for does."""
    from opsmith._build._ort_lib import generate_source
    from opsmith._errors import SpecError
    from opsmith._torch._onnx import ort_specs
    relu = built["relu"]
    specs, _ = ort_specs([relu], items_per_thread={"ortlib::relu": 4})
    assert specs[0].items_per_thread == 4
    launchers = {v.kernel: "launch_" + str(i) for i, v in enumerate(specs[0].variants)}
    assert "grid_for(n, 4)" in generate_source(specs, launchers=launchers)
    specs1, _ = ort_specs([relu])
    assert specs1[0].items_per_thread == 1
    with pytest.raises(SpecError, match=r"items_per_thread\['ortlib::relu'\] = 0"):
        ort_specs([relu], items_per_thread={"ortlib::relu": 0})
