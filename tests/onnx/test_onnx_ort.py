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
from opsmith.onnx._generate import ORT_API_INDEX, ORT_API_VERSION, PARALLEL_FOR_API_VERSION  # noqa: E402
from opsmith.onnx._library import CXX_FLAGS  # noqa: E402

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
    from opsmith.onnx import _session
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
    # KernelContext_ParallelFor (API 17) refuses a null kernel context with its own words
    newer = get_api(PARALLEL_FOR_API_VERSION)
    if newer:
        entries = ctypes.cast(newer, ctypes.POINTER(ctypes.c_void_p))
        pf = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                              ctypes.c_void_p)(entries[ORT_API_INDEX["KernelContext_ParallelFor"]])
        st = pf(None, None, 1, 0, None)
        assert fn("GetErrorMessage", ctypes.c_char_p, ctypes.c_void_p)(st) == b"Invalid context"
        fn("ReleaseStatus", None, ctypes.c_void_p)(st)
    # a tensor's type and shape through our GetTensorTypeAndShape/GetDimensions*/GetTensorElementType
    # happen in every round trip above; the CUDA stream entry (193) in tests/onnx/test_onnx_ort_gpu.py


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
    from opsmith.onnx._doctor import doctor_rows
    rows = {r[0]: r for r in doctor_rows(fresh_cache)}
    assert rows["ONNX Runtime"][1] == "ok" and ort.__version__ in rows["ONNX Runtime"][2]
    assert "CPUExecutionProvider" in rows["ONNX Runtime"][2]
    has_parallel_for = tuple(int(p) for p in ort.__version__.split(".")[:2]) >= (1, PARALLEL_FOR_API_VERSION)
    assert rows["ORT CPU threads"][1] == ("ok" if has_parallel_for else "warning")
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


def test_doctor_cpu_threads_row_by_version():
    from opsmith.onnx._doctor import _cpu_threads_row
    assert _cpu_threads_row("1.17.0")[1] == "ok" and _cpu_threads_row("1.32.0")[1] == "ok"
    name, status, found, fix = _cpu_threads_row("1.15.0")
    assert status == "warning" and "calling thread" in found and "onnxruntime>=1.17" in fix


def test_doctor_missing_cuda_library_fix():
    from opsmith.onnx._doctor import _missing_library_fix
    found, fix = _missing_library_fix("libcudnn.so.9: cannot open shared object file: No such file or directory")
    assert found == "libcudnn.so.9 cannot be loaded" and "cuDNN 9" in fix
    found, fix = _missing_library_fix("libcudart.so.13: cannot open shared object file")
    assert "CUDA runtime" in fix


def test_doctor_has_the_onnx_section():
    from opsmith.cli import _doctor
    assert _doctor.check_onnxruntime in _doctor.CHECKS


def test_items_per_thread_sets_the_grid_of_the_cuda_launch(built):
    """A kernel that handles K items per thread gets ceil(n / (256 K)) blocks, as config_for does."""
    from opsmith._errors import SpecError
    from opsmith.onnx._generate import generate_source
    from opsmith.onnx._specs import ort_specs
    relu = built["relu"]
    specs, _ = ort_specs([relu], items_per_thread={"ortlib::relu": 4})
    assert specs[0].items_per_thread == 4
    launchers = {v.kernel: "launch_" + str(i) for i, v in enumerate(specs[0].variants)}
    assert "grid_for(n, 4)" in generate_source(specs, launchers=launchers, launch_headers=["k.h"], last_error="err")
    specs1, _ = ort_specs([relu])
    assert specs1[0].items_per_thread == 1
    with pytest.raises(SpecError, match=r"items_per_thread\['ortlib::relu'\] = 0"):
        ort_specs([relu], items_per_thread={"ortlib::relu": 0})


def test_specs_come_from_op_descriptions_alone(built):
    """opsmith.onnx reads the op's description, not the torch op: a description that went through
    JSON (as a packaged wheel would carry it), the op's name and any object with the op's .name
    give the same specs."""
    from opsmith import _opdesc
    from opsmith.onnx._specs import ort_specs
    relu = built["relu"]
    copy = _opdesc.OpDescription.from_json(json.loads(json.dumps(_opdesc.get(relu.name).to_json())))
    want = ort_specs([relu])
    assert ort_specs([copy]) == want and ort_specs(["ortlib::relu"]) == want

    class Named:
        name = "ortlib::relu"
    assert ort_specs(Named()) == want
    with pytest.raises(opsmith.SpecError, match="no opsmith op 'ortlib::nope' is registered"):
        ort_specs(["ortlib::nope"])
    shaped = opsmith.custom_op("ortlib::shaped", schema="(Tensor x) -> Tensor",
                               out=opsmith.Out(shape=lambda x: (2,), zeros=True), cpu=lambda x: x.new_zeros(2))
    with pytest.raises(opsmith.SpecError, match="output 0 is allocated like argument 0, shape from a Python "
                                                "function, zeros; the ORT op allocates outputs like an input"):
        ort_specs([shaped], cpu={"ortlib::shaped": "f"})


def test_export_of_every_op_skips_descriptions_torch_does_not_have(built, monkeypatch):
    """A description with no torch op in this process (read from a package) is no node to emit."""
    from opsmith import _opdesc
    monkeypatch.setattr(_opdesc, "_REGISTRY", dict(_opdesc._REGISTRY))
    alone = _opdesc.get("ortlib::relu")._replace(name="ortlib::described_only")
    _opdesc.register(alone)
    table = opsmith.onnx.translation_table()  # no error for the op torch lacks
    assert built["relu"].default in table
    with pytest.raises(opsmith.SpecError, match="torch has no torch.ops.ortlib.described_only"):
        opsmith.onnx.translation_table([alone])


# -- the CPU provider: ORT's Relu bit for bit, ORT's threads, the build flags ---------------------
def _one_node(op_type: str, domain: str, elem, n_out: int = 1) -> bytes:
    """A model of one node ``domain.op_type`` over a 1-D input ``x`` of any length."""
    from onnx import helper
    node = helper.make_node(op_type, ["x"], [f"y{k}" for k in range(n_out)], domain=domain)
    graph = helper.make_graph([node], "one", [helper.make_tensor_value_info("x", elem, ["n"])],
                              [helper.make_tensor_value_info(f"y{k}", elem, ["n"]) for k in range(n_out)])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=9).SerializeToString()


def _threads(k: int):
    so = ort.SessionOptions()
    so.intra_op_num_threads = k
    return so


def _specials(dtype) -> np.ndarray:
    """NaNs of both signs and with a payload, infinities, signed zeros, subnormals, extremes."""
    info = np.finfo(dtype)
    bits = np.uint32 if dtype == np.float32 else np.uint64
    payload_nan = (np.array([0x7FC00123], dtype=np.uint32) if dtype == np.float32 else
                   np.array([0x7FF8000000000123], dtype=np.uint64)).view(dtype)[0]
    vals = [np.nan, -np.nan, payload_nan, -payload_nan, np.inf, -np.inf, 0.0, -0.0, info.tiny / 4, -info.tiny / 4,
            info.tiny, -info.tiny, info.max, -info.max, 1.0, -1.0]
    out = np.array(vals, dtype=dtype)
    assert np.isnan(out[:4]).all() and out.view(bits)[0] != out.view(bits)[2]
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 7, 4097, (1 << 20) + 3, 0])
def test_cpu_node_equals_ort_relu_bitwise(built, n, dtype):
    """Sizes with vector tails and chunks split over two ORT threads; NaN, inf, -0.0 as ORT gives them."""
    elem = onnx.TensorProto.FLOAT if dtype == np.float32 else onnx.TensorProto.DOUBLE
    ours = ort.InferenceSession(_one_node("relu", "ortlib", elem),
                                opsmith.onnx.session_options(built["lib"], _threads(2)),
                                providers=["CPUExecutionProvider"])
    anchor = ort.InferenceSession(_one_node("Relu", "", elem), _threads(2), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(dtype)
    special = _specials(dtype)
    if n:  # specials at random places, and the last items (the tail of the last chunk)
        x[rng.integers(0, n, size=min(n, 64))] = rng.choice(special, size=min(n, 64))
        x[-min(n, len(special)):] = special[:min(n, len(special))]
    got = ours.run(None, {"x": x})[0]
    want = anchor.run(None, {"x": x})[0]
    bits = np.uint32 if dtype == np.float32 else np.uint64
    assert got.shape == (n,) and got.dtype == dtype
    assert np.array_equal(got.view(bits), want.view(bits))


def test_cpu_relu_special_values(built):
    """ORT's Relu (and torch.relu): x < 0 ? 0 : x, so a NaN comes out as the same NaN and -0.0 as -0.0."""
    sess = opsmith.onnx.inference_session(_one_node("relu", "ortlib", onnx.TensorProto.FLOAT), built["lib"])
    x = _specials(np.float32)
    y = sess.run(None, {"x": x})[0]
    keep = ~(x < 0)
    assert np.array_equal(y.view(np.uint32)[keep], x.view(np.uint32)[keep])  # NaNs bit for bit, -0.0 too
    assert np.array_equal(y.view(np.uint32)[~keep], np.zeros((~keep).sum(), np.uint32))  # +0.0
    assert np.signbit(y[7]) and np.isnan(y[1]) and np.signbit(y[1])
    t = torch.relu(torch.from_numpy(x)).numpy()
    assert np.array_equal(y.view(np.uint32), t.view(np.uint32))


def test_library_is_built_optimised_and_records_no_build_paths(built):
    """The flags the library's C++ was compiled with, from its manifest; the library itself holds
    no path of the build (its bytes must not depend on where it was built)."""
    lib = built["lib"]
    flags = json.loads(lib.manifest.read_text())["cxx_flags"]
    assert flags == list(CXX_FLAGS) and "-O3" in flags
    assert "-O0" not in flags and "-ffast-math" not in flags and "-frecord-gcc-switches" not in flags
    data = lib.path.read_bytes()
    assert str(lib.path.parent).encode() not in data
    out = subprocess.run(["readelf", "-S", str(lib.path)], capture_output=True, text=True)
    assert ".GCC.command.line" not in out.stdout, out.stdout


_CHUNKS_SOURCE = r"""
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
static std::atomic<int> next_ordinal{0};
static int ordinal() { thread_local int me = next_ordinal++; return me; }

// y0[i]: where i's chunk starts; y1[i]: which thread ran it. With x[0] == 1 the first chunk waits
// (10 s at most) for a second thread to start a chunk, so that a pool that works shows two threads.
template <typename T> static void chunks(const T *x, T *start, T *thread, long long n, const opsmith::cpu_context &cpu) {
  std::atomic<unsigned> seen{0};
  cpu.parallel_for(n, 1000, [&](long long begin, long long end) {
    seen.fetch_or(1u << (ordinal() % 32));
    if (begin == 0 && x[0] == T(1)) {
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (__builtin_popcount(seen.load()) < 2 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::yield();
    }
    for (long long i = begin; i < end; ++i) { start[i] = T(begin); thread[i] = T(ordinal()); }
  });
}

// the chunk at item 5000 throws: the Run fails with its message, no chunk is left running
template <typename T> static void throws(const T *x, T *y, long long n, const opsmith::cpu_context &cpu) {
  cpu.parallel_for(n, 1000, [&](long long begin, long long end) {
    if (begin <= 5000 && 5000 < end) throw std::runtime_error("chunk with item 5000 failed");
    for (long long i = begin; i < end; ++i) y[i] = x[i];
  });
}
"""


def test_cpu_function_runs_chunks_on_ort_threads(tmp_path):
    where = opsmith.custom_op("ortlib::chunks", schema="(Tensor x) -> (Tensor, Tensor)", cpu=lambda x: (x, x))
    bad = opsmith.custom_op("ortlib::throws", schema="(Tensor x) -> Tensor", cpu=lambda x: x)
    lib = opsmith.onnx.build_library([where, bad], cpu_source=_CHUNKS_SOURCE, out_dir=tmp_path / "lib",
                                     cpu={"ortlib::chunks": "chunks", "ortlib::throws": "throws"})
    n = (1 << 20) + 3
    x = np.zeros(n, np.float32)
    x[0] = 1  # wait for a second thread
    sess = ort.InferenceSession(_one_node("chunks", "ortlib", onnx.TensorProto.FLOAT, n_out=2),
                                opsmith.onnx.session_options(lib, _threads(2)), providers=["CPUExecutionProvider"])
    start, thread = sess.run(None, {"x": x})
    starts = np.unique(start).astype(np.int64)
    # every item once, in chunks that are multiples of 64 items (the last excepted), at most 256
    assert starts[0] == 0 and np.array_equal(start.astype(np.int64)[starts], starts)
    sizes = np.diff(np.append(starts, n))
    assert len(starts) <= 256 and (sizes[:-1] % 64 == 0).all() and (sizes[:-1] >= 1000).all()
    assert np.array_equal(np.repeat(starts, sizes), start.astype(np.int64))
    assert len(np.unique(thread)) == 2  # intra_op_num_threads=2: the caller and one pool thread
    # one thread: one chunk after another, on the calling thread
    one = ort.InferenceSession(_one_node("chunks", "ortlib", onnx.TensorProto.FLOAT, n_out=2),
                               opsmith.onnx.session_options(lib, _threads(1)), providers=["CPUExecutionProvider"])
    x[0] = 0  # no second thread to wait for
    start1, thread1 = one.run(None, {"x": x})
    assert np.array_equal(start1, start) and len(np.unique(thread1)) == 1
    # an exception in a chunk fails the Run with its text
    fails = ort.InferenceSession(_one_node("throws", "ortlib", onnx.TensorProto.FLOAT),
                                 opsmith.onnx.session_options(lib, _threads(2)), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="chunk with item 5000 failed"):
        fails.run(None, {"x": x})
    assert np.array_equal(fails.run(None, {"x": x[:4000]})[0], x[:4000])


def test_cpu_function_of_neither_contract_is_a_compile_error_naming_it(tmp_path):
    op = opsmith.custom_op("ortlib::wrong", schema="(Tensor x) -> Tensor", cpu=lambda x: x)
    src = "template <typename T> static void wrong(const T *x, T *y, int n, bool extra) { (void)x; (void)y; }"
    with pytest.raises(opsmith.CompileError) as exc:
        opsmith.onnx.build_library([op], cpu_source=src, cpu={"ortlib::wrong": "wrong"}, out_dir=tmp_path / "l")
    msg = str(exc.value)
    assert "opsmith op ortlib.wrong (float32): the CPU function wrong must take (const float *, float *, long long)" \
        in msg and "opsmith::cpu_context &cpu" in msg and "docs/onnx.md" in msg
