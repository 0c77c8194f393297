"""Signature parsing and launch-argument checks: every check runs before any driver call.

These need no GPU: the kernels are compiled for a fixed arch and launched with CPU tensors
or wrong arguments, which must be refused with a LaunchError naming the argument.
"""
from __future__ import annotations

import sys

import pytest

import opsmith
from opsmith import LaunchConfig, LaunchError, SpecError
from opsmith._runtime._signature import parse_kernels, parse_params, resolve_signature, split_name_expression

torch = pytest.importorskip("torch")

SRC = r"""
// __global__ void in_a_comment(int x) {}
extern "C" __global__ void __launch_bounds__(256) relu(const float* __restrict__ x,
                                                       float* __restrict__ y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
template <typename T, int N>
__global__ void scale(T* x, T a, unsigned int n) {}
extern "C" {
__global__ void vec(float4* v, size_t n, double d, bool flag, const void* any, short* h) {}
}
__global__ void cpp_kernel(int* out, short s, unsigned char c) {}
#define MY_DIMS(k) __cluster_dims__(k, 1, 1)
template <int K> __global__ void MY_DIMS(K) with_macro(float* x, int n);
"""


def test_parse_kernels_finds_declarations_with_attributes_templates_and_extern_c():
    d = parse_kernels(SRC)
    assert set(d) == {"relu", "scale", "vec", "cpp_kernel", "with_macro"}
    assert d["with_macro"].params_text == "float* x, int n" and d["with_macro"].template_params == ("K",)
    assert d["relu"].extern_c and d["vec"].extern_c and not d["cpp_kernel"].extern_c
    assert d["scale"].template_params == ("T", "N")
    assert d["relu"].params_text == "const float* __restrict__ x, float* __restrict__ y, long long n"


def test_parse_params_kinds_dtypes_ranges_and_alignment():
    ps = parse_params(parse_kernels(SRC)["vec"].params_text)
    assert [(p.name, p.kind) for p in ps] == [("v", "tensor"), ("n", "int"), ("d", "float"),
                                              ("flag", "bool"), ("any", "tensor"), ("h", "tensor")]
    assert ps[0].dtypes == ("float32",) and ps[0].align == 16
    assert ps[1].range == (0, 2**64 - 1) and ps[4].dtypes == () and ps[5].dtypes == ("int16",)
    assert parse_params("const __half* h, __nv_bfloat16* b")[1].dtypes == ("bfloat16",)
    ps = parse_params("int a, unsigned b, long long c, short, unsigned char e, char* s")
    assert [p.range for p in ps[:5]] == [(-2**31, 2**31 - 1), (0, 2**32 - 1), (-2**63, 2**63 - 1),
                                         (-2**15, 2**15 - 1), (0, 255)]
    assert ps[3].name == "arg3" and ps[5].dtypes == ("int8", "uint8")
    assert parse_params("void") == [] and parse_params("") == []


def test_template_resolution_and_name_expressions():
    d = parse_kernels(SRC)["scale"]
    ps = resolve_signature(d, ["double", "4"])
    assert [(p.kind, p.dtypes, p.ctype) for p in ps][:2] == [("tensor", ("float64",), "double* x"),
                                                             ("float", (), "double a")]
    assert split_name_expression("ns::scale<float, 4>") == ("scale", ["float", "4"])
    with pytest.raises(SpecError, match="template"):
        resolve_signature(d, [])


def test_unsupported_parameter_types_are_refused_when_the_kernel_is_taken():
    mod = opsmith.CudaModule('struct P { float a; };\nextern "C" __global__ void k(P p, float** q) {}\n',
                             arch="sm_90")
    with pytest.raises(SpecError, match="argument 0 'p'"):
        mod.get_kernel("k")
    k = mod.get_kernel("k", signature="unsigned long long p, unsigned long long q")
    assert [p.kind for p in k.params] == ["int", "int"]


@pytest.fixture
def relu():
    return opsmith.CudaModule(SRC, arch="sm_90", name_expressions=["scale<float, 2>"]).get_kernel("relu")


@pytest.fixture
def no_driver(monkeypatch):
    """Fail the test if anything reaches the CUDA driver."""
    from opsmith._runtime import _driver

    def boom(*a, **k):
        raise AssertionError("a driver call happened before the arguments were checked")
    for name in ("driver", "raw_launch", "launch_ex", "load_module", "primary_context"):
        monkeypatch.setattr(_driver, name, boom)


CFG = LaunchConfig(grid=1, block=64)


@pytest.mark.parametrize("args,pattern", [
    ((), "takes 3 argument"),
    (("x", "y"), "takes 3 argument"),
    ((1, "y", 3), r"argument 0 'x' \(const float\* __restrict__ x\) expects a contiguous torch.float32 "
                  r"CUDA tensor; got int 1 \(pass the tensor itself"),
    (("T16", "T32", 4), r"argument 0 'x'.*got a torch.float16 tensor"),
    (("T32", "T64", 4), r"argument 1 'y'.*got a torch.float64 tensor"),
    (("T32", "NC", 4), r"argument 1 'y'.*non-contiguous"),
    (("T32", "T32", 2.5), r"argument 2 'n' \(long long n\) expects a Python int.*got float 2.5"),
    (("T32", "T32", 2**63), r"argument 2 'n'.*does not fit long long n"),
    (("T32", "T32", "3"), r"argument 2 'n'.*got str"),
    (("T32", "T32", 4), r"argument 0 'x'.*got a tensor on cpu"),  # all else fine: the device check
])
def test_wrong_arguments_raise_launch_error_before_any_driver_call(relu, no_driver, args, pattern):
    made = {"T16": torch.randn(4).half(), "T32": torch.randn(4), "T64": torch.randn(4).double(),
            "NC": torch.randn(8)[::2]}
    args = tuple(made.get(a, a) if isinstance(a, str) else a for a in args)
    with pytest.raises(LaunchError, match=pattern):
        relu.launch(CFG, *args)
    with pytest.raises(LaunchError, match=pattern):
        relu(1, 64, args)


def test_scalar_and_alignment_checks(no_driver):
    mod = opsmith.CudaModule(SRC, arch="sm_90")
    vec = mod.get_kernel("vec")
    v, h = torch.randn(16), torch.zeros(4, dtype=torch.int16)
    with pytest.raises(LaunchError, match=r"argument 0 'v' \(float4\* v\).*16-byte aligned"):
        vec(1, 32, (v[1:], 4, 1.0, True, v, h))
    with pytest.raises(LaunchError, match=r"argument 1 'n'.*does not fit"):
        vec(1, 32, (v, -1, 1.0, True, v, h))
    with pytest.raises(LaunchError, match=r"argument 2 'd'.*got str"):
        vec(1, 32, (v, 4, "1.0", True, v, h))
    with pytest.raises(LaunchError, match=r"argument 3 'flag'.*got int 2"):
        vec(1, 32, (v, 4, 1.0, 2, v, h))
    with pytest.raises(LaunchError, match=r"argument 5 'h' \(short\* h\).*got a torch.float32"):
        vec(1, 32, (v, 4, 1.0, True, v, v))
    with pytest.raises(LaunchError, match=r"argument 0 'v'.*on cpu"):  # void*: int64 passes; only the device stops it
        vec(1, 32, (v, 4, 1, False, torch.zeros(3, dtype=torch.int64), h))
    cpp = mod.get_kernel("cpp_kernel")
    with pytest.raises(LaunchError, match=r"argument 1 's'.*does not fit"):
        cpp(1, 32, (torch.zeros(4, dtype=torch.int32), 40000, 1))
    with pytest.raises(LaunchError, match=r"argument 2 'c'.*does not fit"):
        cpp(1, 32, (torch.zeros(4, dtype=torch.int32), 1, 256))


def test_launch_config_is_validated():
    assert LaunchConfig((2, 3), (32, 4)).grid == (2, 3, 1)
    for grid, block, smem, pattern in [(0, 32, 0, ">= 1"), (1, 2048, 0, "1024"), (1, (32, 64), 0, "2048 threads"),
                                       ((1, 70000), 32, 0, "65535"), (1, 32, -1, ">= 0"),
                                       ("1", 32, 0, "int"), ((1, 1, 1, 1), 32, 0, "1 to 3")]:
        with pytest.raises(LaunchError, match=pattern):
            LaunchConfig(grid, block, smem)


def test_numpy_integers_and_ints_for_floats_are_accepted(relu, no_driver):
    np = pytest.importorskip("numpy")
    x = torch.randn(4)
    # passes every argument check and stops only at the device (CPU tensors here)
    with pytest.raises(LaunchError, match="on cpu"):
        relu(1, 64, (x, x, np.int64(4)))


def test_launch_on_cpu_only_torch_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA")
    mod = opsmith.CudaModule('extern "C" __global__ void k(int n) {}', arch="sm_90")
    with pytest.raises(opsmith.ToolchainError, match="no CUDA support"):  # as docs/cuda_kernels.md promises
        mod.get_kernel("k")(1, 1, (3,))


def test_compiling_and_taking_kernels_touches_no_driver():
    import subprocess
    code = ("import opsmith; from opsmith._runtime import _driver\n"
            "k = opsmith.cuda_kernel('extern \"C\" __global__ void k(float* x, int n) {}', 'k', arch='sm_90')\n"
            "print(_driver._lib is None, _driver._contexts)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "{}"]


class _FakeLibcuda:
    """Just enough of libcuda for load_module's error paths (no GPU needed)."""

    def __init__(self, load_result: int, driver_version: int = 13000, cc=(9, 0)):
        self.load_result, self.version, self.cc = load_result, driver_version, cc

    def cuDeviceGet(self, out, ordinal):
        out._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxRetain(self, out, dev):
        out._obj.value = 1234
        return 0

    def cuCtxPushCurrent_v2(self, ctx):
        return 0

    def cuCtxPopCurrent_v2(self, out):
        return 0

    def cuModuleLoadData(self, out, data):
        return self.load_result

    def cuDriverGetVersion(self, out):
        out._obj.value = self.version
        return 0

    def cuDeviceGetAttribute(self, out, attr, dev):
        out._obj.value = self.cc[0] if attr == 75 else self.cc[1]
        return 0

    def cuGetErrorName(self, err, out):
        out._obj.value = b"CUDA_ERROR_X"
        return 0

    def cuGetErrorString(self, err, out):
        out._obj.value = b"explained"
        return 0


@pytest.fixture
def fake_driver(monkeypatch):
    from opsmith._runtime import _driver

    def install(lib):
        monkeypatch.setattr(_driver, "_lib", lib)
        monkeypatch.setattr(_driver, "_contexts", {})
    return install


def test_ptx_newer_than_the_driver_is_explained(fake_driver):
    from opsmith._runtime import _driver
    fake_driver(_FakeLibcuda(load_result=222, driver_version=12080))
    with pytest.raises(LaunchError) as info:
        _driver.load_module(b".version 9.0\n", 0, kind="ptx", arch="sm_90", nvrtc_version="13.0", name="k.cu")
    msg = str(info.value)
    assert "NVRTC 13.0" in msg and "supports CUDA 12.8" in msg and "output='cubin'" in msg


def test_cubin_for_another_arch_is_explained(fake_driver):
    from opsmith._runtime import _driver
    fake_driver(_FakeLibcuda(load_result=209, cc=(8, 0)))
    with pytest.raises(LaunchError, match=r"compiled for sm_90 but cuda:0 is sm_80.*arch='sm_80'"):
        _driver.load_module(b"\x7fELF", 0, kind="cubin", arch="sm_90", nvrtc_version="13.0", name="k.cu")


class _LoadingLibcuda(_FakeLibcuda):
    """A fake libcuda that loads modules and reports a spilling kernel."""

    def __init__(self):
        super().__init__(load_result=0)

    def cuModuleLoadData(self, out, data):
        out._obj.value = 0x1000
        return 0

    def cuModuleGetFunction(self, out, module, name):
        out._obj.value = 0x2000
        return 0

    def cuFuncGetAttribute(self, out, attr, fn):
        out._obj.value = {0: 1024, 1: 0, 3: 64, 4: 40, 8: 49152}.get(attr, 0)  # 64 B local: spills
        return 0


def test_kernel_state_reads_attributes_and_warns_on_spills(fake_driver):
    fake_driver(_LoadingLibcuda())
    k = opsmith.cuda_kernel('extern "C" __global__ void k(float* x, int n) {}', "k", arch="sm_90")
    with pytest.warns(ResourceWarning, match="64 bytes of local memory"):
        st = k._state(0)
    a = st.attrs
    assert (a.registers, a.local_bytes, a.max_threads_per_block, a.spills) == (40, 64, 1024, True)
    assert st.fnp.value == 0x2000 and a._asdict()["max_dynamic_shared_bytes"] == 49152
    with pytest.raises(LaunchError, match="at most 1024 per block|1024"):
        LaunchConfig(1, 2048)
    big = LaunchConfig(1, 256, shared_mem=60 * 1024)  # above 48 KiB: needs the smem opt-in
    st.smem_limit = 227 * 1024
    calls = []
    k_fake = _driver_module()
    orig = k_fake.func_set_attribute
    k_fake.func_set_attribute = lambda fn, name, value: calls.append((fn, name, value))
    try:
        k._validate(big, st, 0)
    finally:
        k_fake.func_set_attribute = orig
    assert calls == [(0x2000, "MAX_DYNAMIC_SHARED_SIZE_BYTES", 227 * 1024)]
    with pytest.raises(LaunchError, match="exceed"):
        k._validate(LaunchConfig(1, 256, shared_mem=300 * 1024), st, 0)


def _driver_module():
    from opsmith._runtime import _driver
    return _driver


def test_cubin_from_an_nvrtc_newer_than_the_driver_is_explained(fake_driver):
    from opsmith._runtime import _driver
    fake_driver(_FakeLibcuda(load_result=209, driver_version=12040, cc=(9, 0)))
    with pytest.raises(LaunchError, match=r"NVRTC 13.0, and this driver supports CUDA 12.4"):
        _driver.load_module(b"\x7fELF", 0, kind="cubin", arch="sm_90", nvrtc_version="13.0", name="k.cu")
