"""The C launcher (opsmith._runtime._claunch) without a GPU.

The driver is a ctypes callback standing in for ``cuLaunchKernelEx`` that records what it
was given; torch's current device is a fake that answers -1, so that CPU tensors (device -1)
take the C fast path. Every argument the fast path does not take must end in the Python
launcher, with the same LaunchError text as without the C module.
"""
from __future__ import annotations

import ctypes
import random
import sys
import threading

import pytest

import opsmith
from opsmith import LaunchConfig, LaunchError
from opsmith._runtime._launch_config import _CULaunchConfig

torch = pytest.importorskip("torch")
claunch = pytest.importorskip("opsmith._runtime._claunch", reason="the C launcher is not built (no C compiler at install)")

SRC = r"""
extern "C" __global__ void relu(const float* __restrict__ x, float* __restrict__ y, long long n) {}
extern "C" __global__ void vec(float4* v, size_t n, double d, bool flag, const void* any, short* h) {}
extern "C" __global__ void scalars(signed char a, unsigned char b, short c, unsigned short d, int e,
                                   unsigned f, long long g, unsigned long long h, float fl, double db,
                                   bool t) {}
extern "C" __global__ void none() {}
"""
STREAM = 0x5EED0
FN = 0xF00D


class FakeDriver:
    """A ctypes callback with cuLaunchKernelEx's signature that records each launch."""

    PROTO = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)

    def __init__(self, kernel, result: int = 0):
        self.types = [p.ctypes_type for p in kernel.params]
        self.calls: list[dict] = []
        self.result = result
        self.fn = self.PROTO(self._launch)
        self.address = ctypes.cast(self.fn, ctypes.c_void_p).value

    def _launch(self, cfg, fn, params, extra):
        c = _CULaunchConfig.from_address(cfg)
        self.calls.append({
            "grid": (c.gridDimX, c.gridDimY, c.gridDimZ), "block": (c.blockDimX, c.blockDimY, c.blockDimZ),
            "shared_mem": c.sharedMemBytes, "stream": c.hStream, "attrs": (c.attrs, c.numAttrs),
            "fn": fn, "extra": extra,
            "values": [t.from_address(params[i]).value for i, t in enumerate(self.types)]})
        return self.result


@pytest.fixture(scope="module")
def module():
    return opsmith.CudaModule(SRC, arch="sm_90")


def c_launcher(kernel, result=0, dev=-1, fallback=None, getdev=None):
    """kernel's C launcher on a fake driver, with torch's current device faked as ``dev``."""
    drv = FakeDriver(kernel, result)
    with opsmith.settings.override(c_launch=True):  # whatever OPSMITH_C_LAUNCH says
        launch = kernel._c_launcher(fallback=fallback, getdev=getdev or (lambda: dev),
                                    rawstream=lambda d: STREAM + d + 1)
    assert launch is not None
    launch.set_launch(drv.address)
    if -1 <= dev < claunch.MAX_DEVICE:
        launch.set_function(dev, FN)
    return launch, drv  # the caller keeps drv (and its callback) alive


CFG = LaunchConfig(grid=(3, 2), block=(64, 2), shared_mem=128)


def test_kernels_launch_through_the_c_launcher_unless_switched_off(module, monkeypatch):
    monkeypatch.setenv("OPSMITH_C_LAUNCH", "1")
    k = opsmith.CudaModule(SRC, arch="sm_90").get_kernel("relu")
    assert type(k.launch).__name__ == "Launcher" and k.launch.fallback is k._py_launch
    assert "LaunchConfig" in k.launch.__doc__
    monkeypatch.setenv("OPSMITH_C_LAUNCH", "0")
    k2 = opsmith.CudaModule(SRC, arch="sm_90").get_kernel("relu")
    assert k2.launch is k2._py_launch


def test_the_fast_path_packs_pointers_ints_and_the_config(module):
    k = module.get_kernel("relu")
    launch, drv = c_launcher(k)
    x, y = torch.randn(5), torch.empty(5)
    with pytest.raises(LaunchError, match="on cpu"):  # not validated: Python's slow path
        launch(CFG, x, y, 5)
    assert launch.fallbacks == 1 and not drv.calls
    launch.set_config(-1, CFG)
    launch(CFG, x, y, 5)
    launch(CFG, x, y, -2**63, stream=None)
    assert launch.fallbacks == 1
    first, second = drv.calls
    assert first == {"grid": (3, 2, 1), "block": (64, 2, 1), "shared_mem": 128, "stream": STREAM,
                     "attrs": (None, 0), "fn": FN, "extra": None,
                     "values": [x.data_ptr(), y.data_ptr(), 5]}
    assert second["values"] == [x.data_ptr(), y.data_ptr(), -2**63]


def test_every_scalar_type_is_packed_as_ctypes_packs_it(module):
    k = module.get_kernel("scalars")
    launch, drv = c_launcher(k)
    launch.set_config(-1, CFG)
    for args in [(-128, 0, -2**15, 0, -2**31, 0, -2**63, 0, 0.1, 0.1, False),
                 (127, 255, 2**15 - 1, 2**16 - 1, 2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1, 1e300, -1e-300, True),
                 (-1, 7, -3, 9, 42, 3, -5, 2**63, 3, 7, True)]:  # ints for floats are accepted too
        launch(CFG, *args)
        expected = [t(float(a) if t in (ctypes.c_float, ctypes.c_double) else a).value
                    for t, a in zip(drv.types, args)]
        assert drv.calls[-1]["values"] == expected
    assert launch.fallbacks == 0


def test_no_parameters_use_the_current_device(module):
    k = module.get_kernel("none")
    launch, drv = c_launcher(k, dev=3)
    launch.set_config(3, CFG)
    launch(CFG)
    assert drv.calls[-1]["stream"] == STREAM + 4 and drv.calls[-1]["values"] == []
    assert launch.fallbacks == 0


def test_alignment_and_any_dtype(module):
    k = module.get_kernel("vec")
    launch, drv = c_launcher(k)
    launch.set_config(-1, CFG)
    v, h = torch.randn(16), torch.zeros(4, dtype=torch.int16)
    anything = torch.zeros(3, dtype=torch.int64)
    launch(CFG, v, 4, 1.5, True, anything, h)
    assert drv.calls[-1]["values"] == [v.data_ptr(), 4, 1.5, True, anything.data_ptr(), h.data_ptr()]
    with pytest.raises(LaunchError, match="16-byte aligned"):
        launch(CFG, v[1:], 4, 1.5, True, anything, h)
    assert len(drv.calls) == 1 and launch.fallbacks == 1


def _error(fn, *args, **kwargs) -> str:
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # the text and the type are what is compared
        return f"{type(exc).__name__}: {exc}"
    return "no error"


T32 = torch.randn(4)
BAD = [
    (), (T32,), (T32, T32), (T32, T32, 4, 5), (None, T32, 4), (1, T32, 4), (T32.data_ptr(), T32, 4),
    (T32.half(), T32, 4), (T32, T32.double(), 4), (T32, torch.randn(8)[::2], 4), (T32, T32, 2.5),
    (T32, T32, 2**63), (T32, T32, -2**63 - 1), (T32, T32, 10**40), (T32, T32, "3"), (T32, T32, None),
    (T32, T32, True), (T32, T32, 4 + 0j), (T32, torch.nn.Parameter(torch.randn(4)), 4),
    (T32, T32.to(torch.int32), 4), (T32, T32, T32), ([T32], T32, 4),
]


@pytest.mark.parametrize("args", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_arguments_end_in_the_python_error(module, args):
    k = module.get_kernel("relu")
    launch, drv = c_launcher(k)
    launch.set_config(-1, CFG)
    expected = _error(k._py_launch, CFG, *args)
    assert expected.startswith(("LaunchError", "TypeError"))
    assert _error(launch, CFG, *args) == expected
    assert _error(k.launch, CFG, *args) == expected  # the kernel's own (C) launcher
    assert not drv.calls and launch.fallbacks == 1


def test_numpy_scalars_go_to_python_which_takes_them(module):
    np = pytest.importorskip("numpy")
    k = module.get_kernel("relu")
    calls = []
    launch, drv = c_launcher(k, fallback=lambda *a, **kw: calls.append((a, kw)) or "python")
    launch.set_config(-1, CFG)
    assert launch(CFG, T32, T32, np.int64(4)) == "python"
    assert calls == [((CFG, T32, T32, np.int64(4)), {})] and not drv.calls


@pytest.mark.parametrize("case", ["stream", "keyword", "not validated", "other config", "other device",
                                  "unknown device", "no function", "no driver",
                                  "driver error", "subclass"])
def test_unusual_calls_go_to_the_python_launcher_with_the_original_arguments(module, case):
    k = module.get_kernel("relu")
    calls = []

    def fallback(*args, **kwargs):
        calls.append((args, kwargs))
        return "python"
    x = torch.randn(4)
    args, kwargs, dev = [CFG, x, x, 4], {}, -1
    if case == "other device":
        dev = 0
    if case == "unknown device":
        dev = 64
    launch, drv = c_launcher(k, fallback=fallback, dev=dev, result=1 if case == "driver error" else 0)
    if case not in ("not validated", "unknown device"):
        launch.set_config(dev, CFG)
    if case == "stream":
        kwargs = {"stream": 7}
    elif case == "keyword":
        kwargs = {"strem": None}
    elif case == "other config":
        args[0] = LaunchConfig(grid=(3, 2), block=(64, 2), shared_mem=128)  # equal, not validated
    elif case == "no function":
        launch.set_function(-1, 0)
    elif case == "no driver":
        launch.set_launch(0)
    elif case == "subclass":
        args[1] = torch.nn.Parameter(x)
    assert launch(*args, **kwargs) == "python"
    assert calls == [(tuple(args), kwargs)]
    assert launch.fallbacks == 1
    assert len(drv.calls) == (1 if case == "driver error" else 0)


def test_exceptions_inside_the_checks_fall_back_but_interrupts_propagate(module):
    k = module.get_kernel("relu")

    def broken():
        raise RuntimeError("no device")
    launch, drv = c_launcher(k, fallback=lambda *a, **kw: "python", getdev=broken)
    launch.set_config(-1, CFG)
    assert launch(CFG, T32, T32, 4) == "python"

    def interrupted():
        raise KeyboardInterrupt
    launch, drv = c_launcher(k, fallback=lambda *a, **kw: "python", getdev=interrupted)
    launch.set_config(-1, CFG)
    with pytest.raises(KeyboardInterrupt):
        launch(CFG, T32, T32, 4)


def test_validated_configs_are_mirrored_and_forgotten_with_the_python_side(module):
    from opsmith._runtime._launch_config import KernelAttributes
    from opsmith._torch._kernel import _ACCEPTED_SHARED_CONFIGS, _DeviceState
    with opsmith.settings.override(c_launch=True):
        k = opsmith.CudaModule(SRC, arch="sm_90").get_kernel("relu")
    attrs = KernelAttributes(registers=8, static_shared_bytes=0, max_dynamic_shared_bytes=48 << 10,
                             local_bytes=0, const_bytes=0, max_threads_per_block=1024, ptx_version=90,
                             binary_version=90)
    st = _DeviceState(FN, attrs, 227 << 10)
    configs = [LaunchConfig(i + 1, 32) for i in range(_ACCEPTED_SHARED_CONFIGS + 1)]
    for c in configs[:2]:
        k._validate(c, st, 0)
    assert k.launch.configs(0) == tuple(configs[:2])
    for c in configs[2:]:
        k._validate(c, st, 0)
    assert k.launch.configs(0) == (configs[-1],) and list(st.ok.values()) == [configs[-1]]
    k.launch.set_config(1, configs[0])
    k.launch.set_config(1, configs[0])  # once only
    assert k.launch.configs(1) == (configs[0],)


def test_two_threads_do_not_mix_arguments(module):
    k = module.get_kernel("relu")
    launch, drv = c_launcher(k)
    launch.set_config(-1, CFG)
    tensors = {n: torch.empty(n + 1) for n in range(8)}
    ptr_of = {t.data_ptr(): n for n, t in tensors.items()}
    errors = []

    def worker(n):
        t = tensors[n]
        try:
            for _ in range(300):
                launch(CFG, t, t, n)
        except Exception as exc:  # reported below
            errors.append(exc)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=worker, args=(n,)) for n in tensors]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors and len(drv.calls) == 8 * 300 and launch.fallbacks == 0
    for call in drv.calls:
        x, y, n = call["values"]
        assert ptr_of[x] == n and ptr_of[y] == n


def test_fuzz_reference_counts_and_no_crash(module):
    """Random argument lists: a launch or the Python error, never a crash or a leak."""
    np = pytest.importorskip("numpy")
    k = module.get_kernel("vec")
    launch, drv = c_launcher(k)
    launch.set_config(-1, CFG)
    v, h = torch.randn(16), torch.zeros(4, dtype=torch.int16)
    pool = [v, v[1:], h, torch.randn(16, dtype=torch.float64), torch.randn(8)[::2], torch.nn.Parameter(v),
            None, 0, 1, -1, 2**64 - 1, 2**64, -2**63, 10**100, True, False, 1.5, float("nan"), float("inf"),
            "x", b"x", 1j, np.int64(3), np.float32(2.0), np.bool_(True), object(), (), [v], {}, CFG, 2**63]
    good = [v, 4, 1.0, True, v, h]
    rng = random.Random(1234)
    # objects whose reference count means something (not None, bools, small ints, interned str)
    tracked = [o for o in pool if type(o) not in (type(None), bool, str, bytes, tuple)
               and not (type(o) is int and -5 <= o <= 256)] + [CFG]
    before = [sys.getrefcount(o) for o in tracked]
    launched = 0
    for _ in range(3000):
        args = list(good)
        for _ in range(rng.randint(0, 3)):
            op = rng.random()
            if op < 0.7:
                args[rng.randrange(len(args))] = rng.choice(pool)
            elif op < 0.85:
                args.insert(rng.randrange(len(args) + 1), rng.choice(pool))
            elif args:
                args.pop(rng.randrange(len(args)))
        kwargs = rng.choice([{}, {}, {"stream": None}, {"stream": 0}, {"bad": 1}])
        n = len(drv.calls)
        c_err = _error(launch, CFG, *args, **kwargs)
        if len(drv.calls) > n:
            launched += 1
            assert c_err == "no error"
            continue
        # not launched: the Python launcher's own answer (CPU tensors: at best the device error)
        assert c_err == _error(k._py_launch, CFG, *args, **kwargs)
        assert c_err != "no error"
    assert launched > 100
    del args, kwargs, c_err
    assert [sys.getrefcount(o) for o in tracked] == before


def test_noop_driver_for_benchmarks(module):
    k = module.get_kernel("relu")
    with opsmith.settings.override(c_launch=True):
        launch = k._c_launcher(fallback=lambda *a, **kw: "python", getdev=lambda: -1, rawstream=lambda d: 0)
    launch.set_launch(claunch.noop_address())
    launch.set_function(-1, FN)
    launch.set_config(-1, CFG)
    assert launch(CFG, T32, T32, 4) is None and launch.fallbacks == 0
    lib = ctypes.CDLL(claunch.__file__)
    assert ctypes.cast(lib.opsmith_claunch_noop, ctypes.c_void_p).value == claunch.noop_address()


def test_constructor_refuses_bad_descriptions():
    ok = dict(name="k", fallback=print, tensor_type=torch.Tensor, getdev=print, rawstream=print)
    for params, exc in [([("tensor", (), 3)], ValueError), ([("int", 3, 0, 1)], ValueError),
                        ([("int", 4, 1, 2)], ValueError), ([("float", 2)], ValueError),
                        ([("bool", 4)], ValueError), ([("struct", 4)], ValueError), ([5], ValueError),
                        ([("tensor", (torch.float32,) * 9, 1)], ValueError),
                        ([("int", 8, 0, 2**64)], OverflowError),
                        ([("float", 4)] * (claunch.MAX_PARAMS + 1), ValueError), (None, TypeError)]:
        with pytest.raises(exc):
            claunch.Launcher(params=params, **ok)
    launch = claunch.Launcher(params=[], **ok)
    for bad in [lambda: launch.set_function(64, 1), lambda: launch.set_function(-2, 1),
                lambda: launch.set_config(0, object()), lambda: launch.set_launch("x")]:
        with pytest.raises((ValueError, TypeError, AttributeError)):
            bad()
