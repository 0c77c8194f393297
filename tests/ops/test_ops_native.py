"""opsmith.ops' C++ CUDA implementations without a GPU: the library builds with the real
compiler against this torch, names only kernels the sources have, computes the same launch
plans as opsmith/ops/_launch.py on synthetic devices, and its twelve C++ signatures match the
schemas Python defines (torch checks them when the kernels are registered)."""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from conftest import cache_dir  # noqa: E402
from devices import A100, B200, H100, H200  # noqa: E402  (tests/ops/devices.py)
from opsmith.ops import _launch, _launch_bwd, _launch_norm, _native, _sources  # noqa: E402
from opsmith.ops._launch import DeviceProps  # noqa: E402

# sm_count, max threads a block, max threads an SM, shared memory a block (opt-in), an SM; clusters; DRAM GB/s
DEVICES = {
    "A100": A100,
    "H100": H100,
    "H200": H200,
    "B200": B200,
    "T4": DeviceProps(40, 1024, 1024, 65536, 65536),
    "small": DeviceProps(2, 512, 1024, 49152, 65536),
}


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    with cache_dir(tmp_path_factory.mktemp("native-cache")):
        return _native._open(_native.build())


def test_kernel_table_is_the_sources_kernels(lib):
    table = _native.kernel_table(lib)
    assert len(table) == len(set(table)) == sum(len(_sources.FILES[f]) for f in _sources.NATIVE_FILES)
    assert set(table) == {(f, t) for f in _sources.NATIVE_FILES for t in _sources.FILES[f]}


def test_kernels_whose_plans_pass_48k_of_shared_memory_are_opted_in(lib):
    """A C++ launch of more than 48 KiB of dynamic shared memory fails (CUresult 1) unless the kernel was opted in
    when loaded (_native._prepare): every such kernel of the table is, and the others are not (softmax's float
    backward of 32,768 stages 128 KiB: softmax_bwd_wide_sm)."""
    opted = {t for _, t in _native.kernel_table(lib) if any(p in t for p in _native._SHARED_ABOVE_48K)}
    assert "softmax_bwd_wide_sm<{T}, 8>" in opted and "softmax_bwd_wide<{T}, 8>" not in opted
    assert _launch.softmax_plan(2048, 32768, 4, 2, H100).shared_mem > 48 * 1024
    assert {"softmax_fwd_long<{T}>", "softmax_bwd_long<{T}>"} <= opted


def _py(which, rows, cols, itemsize, arrays, props):
    if which == "elementwise":
        p = _launch.elementwise_plan(rows, itemsize, props, cols == 1)
        return p.strategy, (p.grid[0], 1), (p.block[0], 1), 0, 0, 0, 1, 0
    if which in ("ln_fwd4", "l2", "c4", "small", "c8", "ln_full2", "bwd_c4", "bwd_sm"):
        p = _launch_norm.layer_norm_fwd4_plan(rows, cols, itemsize, props) if which == "ln_fwd4" else \
            _launch_norm.layer_norm_full2_plan(rows, cols, itemsize, props) if which == "ln_full2" else \
            _launch_norm.norm_l2_plan(rows, cols, itemsize, props, arrays) if which == "l2" else \
            _launch_bwd.norm_bwd_small_plan(rows, cols, itemsize, props) if which == "small" else \
            _launch_norm.norm_c8_plan(rows, cols, itemsize, props) if which == "c8" else \
            _launch_bwd.norm_bwd_c4_plan(rows, cols, itemsize, props, arrays) if which == "bwd_c4" else \
            _launch_bwd.norm_bwd_sm_plan(rows, cols, itemsize, props, arrays) if which == "bwd_sm" else \
            _launch_norm.norm_c4_plan(rows, cols, itemsize, props, arrays)
        if p is None:
            return None, (0, 0), (0, 0), 0, 0, 0, 1, 0
        return p.strategy, (p.grid[0], 1), tuple(p.block), p.shared_mem, 0, 0, 1, p.chunks
    if which.startswith("cluster"):
        p = _launch_norm.norm_cluster_plan(rows, cols, itemsize, props, which == "cluster_bwd")
        if p is None:
            return None, (0, 0), (0, 0), 0, 0, 0, 1, 0
        return p.strategy, (p.grid[0], 1), tuple(p.block), p.shared_mem, p.cache, 0, p.cluster, p.chunks
    if which == "row":
        p = _launch.row_plan(rows, cols, itemsize, arrays, props)
        return p.strategy, (p.grid[0], 1), tuple(p.block), p.shared_mem, p.cache, 0, 1, 0
    if which == "softmax":
        p = _launch.softmax_plan(rows, cols, itemsize, arrays, props)
        return p.strategy, (p.grid[0], 1), tuple(p.block), p.shared_mem, p.cache, 0, p.cluster, p.chunks
    if which == "fwd":
        p = _launch_norm.norm_fwd_plan(rows, cols, itemsize, props)
        return p.strategy, (p.grid[0], 1), tuple(p.block), p.shared_mem, p.cache, 0, p.cluster, p.chunks
    if which == "norm_bwd":
        p = _launch_bwd.norm_bwd_plan(rows, cols, itemsize, props, arrays)
        return p.strategy, (p.grid[0], 1), tuple(p.block), p.shared_mem, p.cache, 0, 1, 0
    p, per_chunk = _launch_bwd.weight_grad_plan(rows, cols, itemsize, props)
    return p.strategy, tuple(p.grid), tuple(p.block), 0, 0, per_chunk, p.cluster, 0


ROWS = (1, 2, 7, 64, 131, 1000, 4096, 65536, 10**6)
COLS = (1, 3, 8, 31, 64, 100, 255, 512, 768, 1024, 1536, 2048, 2560, 3000, 3072, 3584, 4096, 5000, 5120, 6144, 7168,
        7680, 8192, 8200, 12000, 12288, 16384,
        18000, 20480, 22528, 24576, 32768, 65536, 65537, 262144)
WHICH = ("row", "weight", "norm_bwd", "softmax", "cluster_fwd", "cluster_bwd", "ln_fwd4", "l2", "c4", "small", "c8",
         "ln_full2", "bwd_c4", "fwd", "bwd_sm")


@pytest.mark.parametrize("device", sorted(DEVICES))
def test_plans_match_python_on_synthetic_devices(lib, device):
    props = DEVICES[device]
    strategies = set()
    for rows, cols, itemsize, arrays in itertools.product(ROWS, COLS, (2, 4, 8), (1, 2)):
        for which in WHICH:
            got = _native.plan(which, rows, cols, itemsize, arrays, props, lib=lib)
            assert got == _py(which, rows, cols, itemsize, arrays, props), (which, rows, cols, itemsize, arrays)
            strategies.add(got[0])
    for n, itemsize, unrolled in itertools.product((1, 5, 1000, 2**20 + 3, 2**23, 3 * 10**9, 2**40), (2, 4, 8),
                                                   (0, 1)):
        assert _native.plan("elementwise", n, unrolled, itemsize, 1, props, lib=lib) == \
            _py("elementwise", n, unrolled, itemsize, 1, props)
    assert {"warp", "block", "long", "columns", "persistent", "split", "wide", "l2", "small"} <= strategies
    assert ("c4" in strategies) == (props.smem_per_block_optin >= 64 << 10)  # norm_bwd_c4_plan: rms_norm's 64 KiB
    assert ("sm" in strategies) == (props.smem_per_sm >= 2 * (32 << 10) + 2048)  # norm_bwd_sm_plan: float rms_norm's
    assert ("cluster" in strategies) == props.clusters


@pytest.mark.parametrize("device", sorted(DEVICES))
def test_softmax_forward_kernel_matches_python(lib, device):
    """The kernel the C++ softmax forward launches (osm_ops.cpp's softmax_fwd_kernel) is the one _functional.softmax_fwd
    launches (_launch.softmax_fwd_kernel), for every plan, x and y aligned or not."""
    props = DEVICES[device]
    seen = set()
    for rows, cols, itemsize, aligned in itertools.product((1, 64, 4096), COLS, (2, 4, 8), (True, False)):
        plan = _launch.softmax_plan(rows, cols, itemsize, 1, props)
        want = _launch.softmax_fwd_kernel(plan, cols, itemsize, aligned)
        assert _native.softmax_fwd_kernel(rows, cols, itemsize, aligned, props, lib=lib) == want, \
            (rows, cols, itemsize, aligned, plan)
        seen.add(want[1].split("<")[0])
    assert {"softmax_fwd", "softmax_fwd_full", "softmax_fwd_wide", "softmax_fwd_long", "softmax_fwd_wide3",
            "softmax_fwd_wide3_full"} <= seen  # every kind of row, checked and not
    assert ("softmax_fwd_cluster" in seen) == props.clusters


def test_plans_match_python_on_random_shapes(lib):
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    @hypothesis.settings(max_examples=300, deadline=None)
    @hypothesis.given(rows=st.integers(1, 2**31), cols=st.integers(1, 2**20), itemsize=st.sampled_from([2, 4, 8]),
                      arrays=st.integers(1, 3), device=st.sampled_from(sorted(DEVICES)))
    def check(rows, cols, itemsize, arrays, device):
        props = DEVICES[device]
        for which in WHICH:
            assert _native.plan(which, rows, cols, itemsize, arrays, props, lib=lib) == \
                _py(which, rows, cols, itemsize, arrays, props)
    check()


def test_signatures_match_the_schemas(lib, tmp_path):
    """In a fresh process: the schemas defined as opsmith.ops does, then the C++ kernels registered
    for CUDA (torch refuses a C++ signature that does not match the schema)."""
    script = textwrap.dedent(f"""
        import ctypes, torch
        from opsmith.ops import _native, _register
        _native._state["lib"] = _native._open({str(lib._name)!r})
        _native._init = lambda lib, cuda: None          # no driver on this machine; nothing launches
        _register._use_native = lambda: True
        ops = _register.ops()
        for name in _register.OP_NAMES:  # the CUDA kernel is the C++ one (not the Python fallback)
            cuda = [l for l in torch._C._dispatch_dump(f"opsmith::{{name}}").splitlines() if l.startswith("CUDA")]
            assert len(cuda) == 1 and "osm_ops.cpp" in cuda[0], (name, cuda)
        for name in ("layer_norm_y", "rms_norm_y"):  # the first outputs alone: C++ composites over the ops
            dump = torch._C._dispatch_dump(f"opsmith::{{name}}")
            assert "CompositeImplicitAutograd" in dump and "osm_ops.cpp" in dump, dump
        x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
        w = torch.randn(8, dtype=torch.float64)
        y = ops.layer_norm_y(x, [8], w, None, 1e-5)
        assert torch.allclose(y, torch.nn.functional.layer_norm(x, [8], w, None, 1e-5))
        (g,) = torch.autograd.grad(ops.rms_norm_y(x, [8], w, None).sum(), x)  # through the full op's autograd
        xr = x.detach().requires_grad_()
        (want,) = torch.autograd.grad(torch.nn.functional.rms_norm(xr, [8], w).sum(), xr)
        assert torch.allclose(g, want)
        err = ctypes.create_string_buffer(256)
        assert _native.library().osm_ops_register(err, 256) == 0  # once per process: a second call is a no-op
        x = torch.randn(3, 8)
        assert torch.equal(ops.layer_norm(x, [8])[0], torch.nn.functional.layer_norm(x, [8]))  # CPU still Python's
        print("ok")
    """)
    env = dict(os.environ, OPSMITH_CACHE_DIR=str(tmp_path / "cache"), OPSMITH_TORCH_OP_NATIVE_AUTOGRAD="0")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_off_switch_and_cpu_machines_keep_python(monkeypatch):
    from opsmith._config import settings
    from opsmith.ops import _register
    with settings.override(ops_native=False):
        assert not _native.usable()
    if not torch.cuda.is_available():
        assert not _register._use_native()  # no CUDA device: nothing to build


def test_a_library_that_cannot_be_built_leaves_python_with_one_warning(monkeypatch, caplog):
    def fail():
        raise _native.OpsmithError("no C++ compiler found")

    monkeypatch.setattr(_native, "_state", {})
    monkeypatch.setattr(_native, "build", fail)
    with caplog.at_level("WARNING"):
        assert not _native.usable() and not _native.usable()
    assert caplog.text.count("opsmith.ops' native CUDA implementations unavailable (no C++ compiler found); "
                             "the ops use their Python implementations (set OPSMITH_OPS_NATIVE=0") == 1


def test_eager_calls_run_the_ops_and_hand_the_rest_to_torch(lib, tmp_path):
    """In a fresh process with the C++ kernels registered (CPU tensors reach the CPU kernels
    through the same dispatcher call): the public functions' eager calls are the library's typed
    calls (osm_ops_python.h), equal to torch's functions with their gradients; a tensor subclass,
    a torch-function mode, an argument of another type or an error go to the fallback."""
    script = textwrap.dedent(f"""
        import torch, torch.nn.functional as F
        import opsmith.ops as O
        from opsmith.ops import _native, _register, _public
        _native._state["lib"] = _native._open({str(lib._name)!r})
        _native._init = lambda lib, cuda: None          # no driver on this machine; nothing launches
        _register._use_native = lambda: True
        assert _register.native_registered()
        x = torch.randn(4, 8, dtype=torch.float64)
        w, b = torch.nn.Parameter(torch.randn(8, dtype=torch.float64)), torch.randn(8, dtype=torch.float64)
        for name in _public._FAST:
            assert type(_public._call(name)).__name__ == "builtin_function_or_method", name
            assert _public._call(name).__module__ == "opsmith_ops_fast", name
        cases = [(O.relu(x), torch.relu(x)), (O.silu(x), F.silu(x)), (O.gelu(x), F.gelu(x)),
                 (O.gelu(x, "tanh"), F.gelu(x, approximate="tanh")), (O.softmax(x, 0), torch.softmax(x, 0)),
                 (O.layer_norm(x, 8, w, b), F.layer_norm(x, [8], w, b)), (O.layer_norm(x, [8]), F.layer_norm(x, [8])),
                 (O.rms_norm(x, [8], w, 1e-3), F.rms_norm(x, [8], w, 1e-3)), (O.rms_norm(x, 8), F.rms_norm(x, [8]))]
        for i, (got, want) in enumerate(cases):
            assert torch.allclose(got, want), i
        # the ops the library does not serve take the OpOverload builtin, with nothing said
        assert torch.allclose(O.silu_and_mul(x), F.silu(x[:, :4]) * x[:, 4:])
        assert torch.allclose(O.add_rms_norm(x, x, 8)[1], 2 * x)
        assert _public._call("silu_and_mul").__module__ != "opsmith_ops_fast" and not _public._warned
        xg = x.clone().requires_grad_()
        (g,) = torch.autograd.grad(O.layer_norm(xg, [8], w, b).square().sum(), xg)
        xt = x.clone().requires_grad_()
        (want,) = torch.autograd.grad(F.layer_norm(xt, [8], w, b).square().sum(), xt)
        assert torch.allclose(g, want)
        with torch.no_grad():
            assert not O.rms_norm(xg, [8], w).requires_grad
        try:  # an error inside the op: raised by the fallback, as torch raises it
            O.layer_norm(x, [8], torch.randn(7, dtype=torch.float64))
        except Exception as exc:
            err = exc
        try:
            _register.ops().layer_norm_y.default(x, [8], torch.randn(7, dtype=torch.float64), None, 1e-5)
        except Exception as exc:
            assert type(exc) is type(err) and str(exc) == str(err), (exc, err)

        make = __import__("ctypes").PyDLL(_native.library()._opsmith_path).osm_ops_python
        make.restype, make.argtypes = __import__("ctypes").py_object, [__import__("ctypes").py_object]
        m = make({{n: (lambda n: lambda *a: ("fallback", n))(n) for n in _public._FAST.values()}})
        class Sub(torch.Tensor):
            pass
        class Mode(torch.overrides.TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {{}}))
        assert isinstance(m.relu(x), torch.Tensor) and isinstance(m.rms_norm_y(x, [8], None, None), torch.Tensor)
        with Mode():
            assert m.relu(x) == ("fallback", "relu")
        refused = [m.relu(x.as_subclass(Sub)), m.relu(x, x), m.silu(1.0), m.gelu(x, 5), m.gelu(x, "bad"),
                   m.softmax(x, 1.0), m.softmax(x, True), m.softmax(x, 2 ** 70), m.layer_norm_y(x, (8,), None, None, 1e-5),
                   m.layer_norm_y(x, [8], 1, None, 1e-5), m.rms_norm_y(x, [8], None, "1")]
        assert all(r[0] == "fallback" for r in refused), refused
        print("ok")
    """)
    env = dict(os.environ, OPSMITH_CACHE_DIR=str(tmp_path / "cache"), OPSMITH_TORCH_OP_NATIVE_AUTOGRAD="0")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
