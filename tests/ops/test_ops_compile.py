"""opsmith.ops without a GPU: every kernel source compiles through NVRTC for sm_80, sm_90 and
sm_100 in every dtype (concurrently, through compile_many), each kernel's signature takes the
right dtypes, the launch plans on synthetic devices, compile_many's contract, the CPU path
and the CLI's `warm --ops`."""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import opsmith
from launch_check import CheckedLaunch  # tests/ops/launch_check.py (pytest puts tests/ops on the path)
from opsmith._errors import CompileError, SpecError
from opsmith.ops import _launch, _sources
from opsmith.ops._launch import DeviceProps, row_plan

ROOT = Path(__file__).resolve().parents[2]
ARCHS = ("sm_80", "sm_90", "sm_100")

# synthetic devices: H100-like, A100-like, and a small part with the classic 48 KiB of shared memory
H100 = DeviceProps(sm_count=132, max_threads_per_block=1024, max_threads_per_sm=2048,
                   smem_per_block_optin=232448, smem_per_sm=233472, clusters=True)
A100 = DeviceProps(108, 1024, 2048, 166912, 167936)
SMALL = DeviceProps(8, 1024, 1536, 49152, 65536)
TORCH_DTYPE = {"float32": "float32", "float64": "float64", "float16": "float16", "bfloat16": "bfloat16"}

pytest.importorskip("cuda.bindings.nvrtc", reason="compiling needs cuda-bindings (pip install 'opsmith[cuda]')")


def _pointer_params(kernel):
    return [p for p in kernel.params if p.kind == "tensor"]


def test_every_source_compiles_for_every_arch_and_dtype():
    jobs = [j for arch in ARCHS for j in _sources.jobs(arch)]
    binaries = opsmith.compile_many(jobs, progress=False)
    assert len(binaries) == len(ARCHS) * len(_sources.FILES) * len(_sources.DTYPES)
    for job, binary in zip(jobs, binaries):
        assert binary.kind == "cubin" and binary.arch == job["arch"] and binary.code[:4] == b"\x7fELF"
        assert sorted(binary.lowered_names) == sorted(job["name_expressions"])
        assert "warning" not in binary.log.lower(), binary.log
    # every kernel's parsed signature: element pointers take the dtype, stats the accumulation dtype,
    # index tables (rotary's positions and its shape/stride table, cross_entropy's targets) int64
    for dtype, (ctype, acc) in _sources.DTYPES.items():
        for file in _sources.FILES:
            binary = next(b for j, b in zip(jobs, binaries)
                          if j["arch"] == "sm_90" and j["source"].name == file and ctype in j["name_expressions"][0])
            module = opsmith.CudaModule(binary)
            for name in _sources.kernel_names(file, dtype):
                kernel = module.get_kernel(name)
                dts = {p.dtypes[0] for p in _pointer_params(kernel)}
                expected = {TORCH_DTYPE[dtype], "float64" if acc == "double" else "float32"}
                expected |= {"int64"} if file in ("rotary.cu", "cross_entropy.cu") else set()
                assert dts <= expected, (name, dts)
                assert TORCH_DTYPE[dtype] in dts


def test_kernel_sources_need_no_cuda_headers_and_ship_as_package_data():
    text = (ROOT / "pyproject.toml").read_text()
    assert '"opsmith.ops" = ["kernels/*.cu", "kernels/*.cuh", "native/*.cpp", "native/*.h"]' in text
    names = sorted(p.name for p in _sources.KERNEL_DIR.iterdir())
    assert names == ["activations.cuh", "common.cuh", "cross_entropy.cu", "elementwise.cu", "fused_norm.cu", "gated.cu",
                     "norm.cu", "norm_cluster.cu", "norm_long.cu", "norm_split.cu", "rotary.cu", "rows.cuh",
                     "softmax.cu", "softmax_cluster.cu"]
    # the only includes are our own headers (common.cuh first, or rows.cuh, which includes it) and
    # CUDA's fp16/bf16 headers, behind __has_include
    ours = {'#include "common.cuh"', '#include "rows.cuh"', '#include "activations.cuh"'}
    for path in [*_sources.KERNEL_DIR.glob("*.cu"), _sources.KERNEL_DIR / "activations.cuh",
                 _sources.KERNEL_DIR / "rows.cuh"]:
        includes = [line for line in path.read_text().splitlines() if line.startswith("#include")]
        assert set(includes) <= ours, (path.name, includes)
        assert includes[0] in ('#include "common.cuh"', '#include "rows.cuh"'), (path.name, includes)


def test_compile_many_keeps_order_and_raises_the_first_failure_after_every_job():
    good = 'extern "C" __global__ void k%d(float* x) { x[0] = %d; }'
    jobs = [{"source": good % (i, i), "name": f"good{i}.cu"} for i in range(3)]
    jobs.insert(1, {"source": "__global__ void broken( {", "name": "broken.cu"})
    from opsmith._build import _nvrtc
    with pytest.raises(CompileError) as info:
        opsmith.compile_many(jobs, arch="sm_90", max_workers=2, progress=False)
    assert info.value.source == "broken.cu"
    before = _nvrtc.nvrtc_stats["compiles"]
    ok = opsmith.compile_many([j for j in jobs if j["name"] != "broken.cu"], arch="sm_90", progress=False)
    assert [b.name for b in ok] == ["good0.cu", "good1.cu", "good2.cu"]
    assert _nvrtc.nvrtc_stats["compiles"] == before  # compiled by the failed call, which ran every job
    with pytest.raises(SpecError, match="target arch"):
        opsmith.compile_many([{"source": good % (9, 9)}], progress=False)
    with pytest.raises(SpecError, match="source"):
        opsmith.compile_many([{"arch": "sm_90"}], progress=False)
    with pytest.raises(SpecError, match="max_workers"):
        opsmith.compile_many(jobs, arch="sm_90", max_workers=0)


def test_one_key_compiles_once_when_threads_race():
    from opsmith._build import _nvrtc
    src = 'extern "C" __global__ void race(float* x) { x[0] = 42.f; }'
    before = _nvrtc.nvrtc_stats["compiles"]
    results = []
    barrier = threading.Barrier(4)

    def go():
        barrier.wait()
        results.append(opsmith.compile_cuda(src, arch="sm_90"))

    threads = [threading.Thread(target=go) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _nvrtc.nvrtc_stats["compiles"] - before == 1
    assert len({r.key for r in results}) == 1


@pytest.mark.parametrize("props", [H100, A100, SMALL], ids=["h100", "a100", "small"])
@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_row_plans_cover_every_row_within_the_device_limits(props, itemsize):
    vec = 16 // itemsize
    for arrays in (1, 2):
        for cols in (1, 2, 7, 31, 64, 100, 255, 256, 1000, 1024, 3000, 4096, 8192, 16384, 32768, 100_000):
            for rows in (1, 3, 65536):
                plan = row_plan(rows, cols, itemsize, arrays, props)
                threads = plan.block[0] * plan.block[1]
                assert 1 <= threads <= props.max_threads_per_block, plan
                assert plan.grid[0] >= 1
                if plan.strategy in ("warp", "block"):
                    tpr, per_block = plan.block
                    assert tpr & (tpr - 1) == 0  # a power of two: the shuffles' groups
                    assert tpr * _launch.ROW_CHUNKS * vec >= cols  # the row fits in registers
                    assert plan.grid[0] * per_block >= rows  # every row has its threads
                    assert (tpr <= 32) == (plan.strategy == "warp")
                    assert plan.strategy == "warp" or (per_block == 1 and tpr <= _launch.ROW_THREADS)
                    assert plan.shared_mem == 0
                else:
                    assert plan.strategy == "long" and plan.block[1] == 1
                    assert plan.block[0] % 32 == 0 and plan.block[0] <= _launch.LONG_THREADS
                    assert cols > _launch.ROW_THREADS * _launch.ROW_CHUNKS * vec // 2
                    assert plan.grid[0] <= rows
                    if plan.cache:
                        assert plan.shared_mem >= arrays * cols * itemsize
                        assert plan.shared_mem + 1024 <= props.smem_per_block_optin
                    else:
                        assert plan.shared_mem == 0
                        assert arrays * cols * itemsize + 1024 > props.smem_per_block_optin


def test_row_plan_strategy_boundaries_follow_the_device():
    # fp32: 8 floats a thread in registers; one warp holds 256, a 512-thread block 4096
    assert row_plan(1024, 256, 4, 1, H100).strategy == "warp"
    assert row_plan(1024, 257, 4, 1, H100).strategy == "block"
    assert row_plan(1024, 4096, 4, 1, H100).strategy == "block"
    assert row_plan(1024, 4097, 4, 1, H100).strategy == "long"
    # a long row is cached in shared memory where the opt-in limit allows, else read again
    assert row_plan(1024, 32768, 4, 1, H100).cache == 1
    assert row_plan(1024, 32768, 4, 2, H100).cache == 0  # 256 KiB for grad and y: too much
    assert row_plan(1024, 32768, 4, 1, A100).cache == 1
    assert row_plan(1024, 32768, 4, 1, SMALL).cache == 0
    # few rows: fewer rows a block so that more SMs get work
    few, many = row_plan(64, 64, 4, 1, H100), row_plan(65536, 64, 4, 1, H100)
    assert few.block[1] < many.block[1] and few.grid[0] * few.block[1] >= 64
    # grids come from the device: more SMs, more resident blocks
    assert row_plan(65536, 32768, 2, 1, H100).grid[0] > row_plan(65536, 32768, 2, 1, SMALL).grid[0]


def test_elementwise_and_weight_grad_plans():
    for props in (H100, A100, SMALL):
        assert _launch.elementwise_plan(1, 4, props).grid == (1,)
        # one trip per thread: 8 bf16 per vector, EW_UNROLL vectors, EW_THREADS threads a block
        per_block = 8 * _launch.EW_UNROLL * _launch.EW_THREADS
        assert _launch.elementwise_plan(1 << 28, 2, props).grid == ((1 << 28) // per_block,)
        assert _launch.elementwise_plan(1000, 4, props).grid == (1,)  # 1000 floats: 250 vectors, one block
        for (rows, cols), itemsize in itertools.product(
                ((1, 1), (7, 33), (16, 4096), (17, 4096), (1024, 4096), (65536, 4096), (3, 100_000), (10**7, 64)),
                (2, 4, 8)):
            plan, per_chunk = _launch.weight_grad_plan(rows, cols, itemsize, props)
            col_blocks = -(-cols // (32 * (16 // itemsize)))
            if plan.strategy == "cluster":  # sm_90+: a cluster of chunks a column block, blocks enough for half the SMs
                assert props.clusters and rows > 16 and 2 * plan.grid[0] * col_blocks >= props.sm_count
                assert rows * cols * itemsize <= _launch.WEIGHT_CLUSTER_BYTES
                assert plan.grid == (_launch.WEIGHT_CLUSTER, col_blocks) and plan.cluster == _launch.WEIGHT_CLUSTER
                assert per_chunk == -(-rows // _launch.WEIGHT_CLUSTER)  # trailing chunks may be empty
                continue
            assert (not props.clusters or rows <= 16 or 2 * _launch.WEIGHT_CLUSTER * col_blocks < props.sm_count
                    or rows * cols * itemsize > _launch.WEIGHT_CLUSTER_BYTES)
            assert plan.grid[0] * 32 * (16 // itemsize) >= cols > (plan.grid[0] - 1) * 32 * (16 // itemsize)
            assert plan.grid[1] * per_chunk >= rows and plan.grid[1] <= 65535
            assert (plan.grid[1] - 1) * per_chunk < rows  # no empty chunk
            assert plan.grid[1] == 1 or rows > 16  # up to two rows a row lane: one chunk, no norm_col_sum
            assert per_chunk <= 8 * _launch.WEIGHT_LANE_ROWS or per_chunk == -(-rows // 65535)  # at most 8 rows a lane
    assert _launch.launch_config(_launch.elementwise_plan(1 << 20, 4, H100)) is \
        _launch.launch_config(_launch.elementwise_plan(1 << 20, 4, H100))  # one config per plan


def test_ops_on_cpu_are_torchs():
    import torch
    import torch.nn.functional as F

    from opsmith import ops
    torch.manual_seed(0)
    x = torch.randn(5, 7, dtype=torch.float64)
    w, b = torch.randn(7, dtype=torch.float64), torch.randn(7, dtype=torch.float64)
    assert torch.equal(ops.relu(x), torch.relu(x))
    assert torch.equal(ops.gelu(x, "tanh"), F.gelu(x, approximate="tanh"))
    assert torch.equal(ops.silu(x), F.silu(x))
    assert torch.equal(ops.softmax(x, 0), torch.softmax(x, 0))
    assert torch.equal(ops.layer_norm(x, 7, w, b), F.layer_norm(x, (7,), w, b))
    assert torch.equal(ops.rms_norm(x, (7,), w), F.rms_norm(x, (7,), w))
    assert torch.equal(ops.LayerNorm(7, dtype=torch.float64)(x), F.layer_norm(x, (7,), torch.ones(7, dtype=torch.float64),
                                                                             torch.zeros(7, dtype=torch.float64)))
    assert "approximate='tanh'" in repr(ops.GELU("tanh"))
    with pytest.raises(SpecError, match="approximate"):
        ops.gelu(x, "fast")


def test_import_is_cheap_and_public_names_resolve():
    code = ("import sys, opsmith.ops as o; assert 'torch' not in sys.modules, 'torch imported'; "
            "assert sorted(o.__all__) == sorted(dir(o)); print(len(o.__all__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    from opsmith import ops
    for name in ops.__all__:
        assert getattr(ops, name) is not None
    assert opsmith.compile_many is opsmith._build._many.compile_many


def test_cli_warm_ops_compiles_then_hits(fresh_cache):
    """`opsmith warm --ops` compiles every program once; the next process takes them all from the cache."""
    env = {**os.environ, "OPSMITH_CACHE_DIR": str(fresh_cache)}
    outs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-m", "opsmith", "warm", "--ops", "--arch", "sm_90"], env=env,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        outs.append(out.stdout)
    programs = len(_sources.FILES) * len(_sources.DTYPES)
    kernels = sum(map(len, _sources.FILES.values())) * len(_sources.DTYPES)
    assert f"opsmith.ops for sm_90: {programs} programs ({kernels} kernels), {programs} compiled, 0 from the cache" in outs[0]
    assert f"opsmith.ops for sm_90: {programs} programs ({kernels} kernels), 0 compiled, {programs} from the cache" in outs[1]
    for out in outs:  # and the torch C++ libraries the ops run on, built once for this torch
        assert "opsmith.ops native CUDA kernels (opsmith/ops/native/osm_ops.cpp): ready for this torch" in out
        assert "opsmith.ops native Autograd kernels" in out


# -- the torch operators (CPU: torch's code or the formula; the schemas, fakes and autograd are the CUDA ones') --
def _op_cases(torch, dtype=None):
    dtype = dtype or torch.float64
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 3, 10, dtype=dtype, generator=g)
    w, b = torch.randn(10, dtype=dtype, generator=g), torch.randn(10, dtype=dtype, generator=g)
    x2 = torch.randn(4, 3, 10, dtype=dtype, generator=g)
    mean = torch.randn(12, dtype=torch.float64 if dtype == torch.float64 else torch.float32, generator=g)
    rstd = mean.abs() + 0.5
    return [("relu", (x,)), ("relu_backward", (x2, x)), ("gelu", (x,)), ("gelu", (x, "tanh")),
            ("gelu_backward", (x2, x, "tanh")), ("silu", (x,)), ("silu_backward", (x2, x)), ("softmax", (x,)),
            ("softmax", (x, 1)), ("softmax_backward", (x2, torch.softmax(x, 0), 0)),
            ("layer_norm", (x, [10], w, b, 1e-5)), ("layer_norm", (x, [3, 10], None, None, 1e-3)),
            ("layer_norm_backward", (x2, x, [10], mean, rstd, True, True, w)),
            ("layer_norm_backward", (x2, x, [10], mean, rstd, False, False, None)),
            ("rms_norm", (x, [10], w, None)), ("rms_norm", (x, [10], None, 1e-5)),
            ("rms_norm_backward", (x2, x, [10], rstd, True, w))]


def test_registered_ops_pass_opcheck_on_cpu():
    import torch
    from opsmith.ops._register import OP_NAMES, ops
    T = ops()
    cases = _op_cases(torch)
    assert {name for name, _ in cases} == set(OP_NAMES)
    for name, args in cases:
        # forwards get inputs that require grad (autograd is checked); backwards plain ones
        args = tuple(a.detach().clone().requires_grad_(not name.endswith("backward"))
                     if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        result = torch.library.opcheck(getattr(T, name).default, args)
        assert set(result.values()) == {"SUCCESS"}, (name, result)
    # a gradient of a gradient is refused with a clear error, never silently wrong
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(T.silu(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):  # the native kernel's error (the Python one's
        g.sum().backward()                                      # NotImplementedError is a RuntimeError)
    from opsmith._torch._ops import _OPS
    assert {_OPS[f"opsmith::{name}"].autograd for name in OP_NAMES} == {"native"}  # no Python on the call path
    assert str(T.layer_norm.default._schema) == (
        "opsmith::layer_norm(Tensor x, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, "
        "float eps=1.0000000000000001e-05) -> (Tensor, Tensor, Tensor)")


def test_fake_kernels_give_the_cuda_outputs_shapes_and_dtypes():
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from opsmith.ops._register import ops
    T = ops()
    with FakeTensorMode():
        x = torch.empty(6, 5, 8, dtype=torch.bfloat16)
        y, mean, rstd = T.layer_norm(x, [5, 8])
        assert y.shape == x.shape and y.dtype == torch.bfloat16 and y.is_contiguous()
        assert mean.shape == (6,) and mean.dtype == torch.float32 and rstd.shape == (6,)
        y, rstd = T.rms_norm(x.double(), [8])
        assert rstd.shape == (30,) and rstd.dtype == torch.float64
        dx, dw, db = T.layer_norm_backward(x, x, [8], mean.new_empty(30), mean.new_empty(30), True, False, None)
        assert dx.shape == x.shape and dw.shape == (8,) and db.shape == (0,)
        assert T.softmax(x.transpose(0, 2), 0).is_contiguous()


def test_ops_trace_into_one_graph_with_torch_compile():
    import torch
    from opsmith import ops
    torch._dynamo.reset()
    x = torch.randn(4, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, dtype=torch.float64, requires_grad=True)

    def f(x, w):
        h = ops.gelu(ops.silu(ops.relu(x) + x), "tanh")
        return ops.rms_norm(ops.softmax(ops.layer_norm(h, 16, w, w), -1), 16, w)

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)  # fullgraph: a graph break raises
    out = compiled(x, w)
    ref = f(x, w)
    torch.testing.assert_close(out, ref)
    (gx, gw), (rx, rw) = torch.autograd.grad(out.sum(), (x, w)), torch.autograd.grad(ref.sum(), (x, w))
    torch.testing.assert_close(gx, rx)
    torch.testing.assert_close(gw, rw)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_cuda_paths_pass_each_kernel_the_arguments_of_its_signature(dtype, monkeypatch):
    """The CUDA implementations run on CPU tensors here, with launches checked against the
    kernels' signatures: every strategy of every op, with and without weight and bias."""
    import torch
    from opsmith.ops import _functional as fn
    from opsmith.ops import _norms as nf
    binaries = {j["source"].name: b for j, b in zip(_sources.jobs("sm_90", (dtype,)),
                                                   opsmith.compile_many(_sources.jobs("sm_90", (dtype,)), progress=False))}
    modules = {f: opsmith.CudaModule(b) for f, b in binaries.items()}
    calls: list = []

    def kernel(file, name, dt, device):
        t, a = _sources.DTYPES[dt]
        return CheckedLaunch(modules[file].get_kernel(name.format(T=t, A=a)), calls)

    monkeypatch.setattr(_sources, "kernel", kernel)
    monkeypatch.setattr(_launch, "device_props", lambda device: H100)
    dt = getattr(torch, dtype)
    # warp, block, wide (layer_norm), cluster, long cached (its forward), long uncached
    for cols in (1, 100, 1024, 3000, 6000, 12000, 20000, 40000, 70000):
        x = torch.randn(3, cols, dtype=dt)
        w, b = torch.randn(cols, dtype=dt), torch.randn(cols, dtype=dt)
        for op in ("relu", "gelu_erf", "gelu_tanh", "silu"):
            fn.ew_fwd(op, x)
            fn.ew_bwd(op, x, x)
        fn.softmax_cuda(x, -1)
        fn.softmax_cuda(x, 0)
        fn.softmax_backward_cuda(x, x, -1)
        monkeypatch.setattr(_launch, "device_props", lambda device: A100)  # no clusters: softmax's wide rows
        fn.softmax_cuda(x, -1)
        fn.softmax_backward_cuda(x, x, -1)
        monkeypatch.setattr(_launch, "device_props", lambda device: H100)
        for weight, bias in ((w, b), (None, None), (w, None)):
            y, mean, rstd = nf.layer_norm_fwd(x, [cols], weight, bias, 1e-5)
            assert mean.dtype == (torch.float64 if dtype == "float64" else torch.float32) and mean.shape == (3,)
            dx, dw, db = nf.layer_norm_bwd(x, x, [cols], mean, rstd, weight is not None, bias is not None, weight)
            assert dx.shape == x.shape and dw.shape == ((cols,) if weight is not None else (0,))
            y, rstd = nf.rms_norm_fwd(x, [cols], weight, None)
            dx, dw = nf.rms_norm_bwd(x, x, [cols], rstd, weight is not None, weight)
        for weight in (w, None):
            from opsmith.ops import _fused
            y, s, rstd = _fused.add_rms_norm_cuda(x, x, [cols], weight, None)
            assert y.shape == s.shape == x.shape and rstd.shape == (3,)
            y, s, mean, rstd = _fused.add_layer_norm_cuda(x, x, [cols], weight, weight, 1e-5)
            assert y.shape == s.shape == x.shape and mean.shape == rstd.shape == (3,)
        from opsmith.ops import _rotary
        if cols >= 2:
            half = cols // 2
            cos = torch.randn(3, half, dtype=dt)
            assert _rotary.rotary_cuda(x, cos, cos, None, False, 1).shape == x.shape
            assert _rotary.rotary_cuda(x, cos, cos, torch.tensor([2, 0, 1]), True, -1).shape == x.shape
        if cols % 2 == 0:  # full-width tables on a transposed [batch, seq, heads, d] view: no copy
            xt = torch.randn(2, 3, 2, cols, dtype=dt).transpose(1, 2)
            full = torch.randn(2, 1, 3, cols, dtype=dt)
            y = _rotary.rotary_cuda(xt, full, full, None, False, 1)
            assert y.shape == xt.shape and y.stride() == xt.stride()
            tab = torch.randn(5, cols // 2, dtype=dt)  # a position table for a transposed x (raised before)
            y = _rotary.rotary_cuda(xt, tab, tab, torch.randint(0, 5, (2, 1, 3)), False, 1)
            assert y.shape == xt.shape and y.stride() == xt.stride()
            kt = torch.randn(2, 3, 1, cols, dtype=dt).transpose(1, 2)  # q and k in one launch, k with fewer heads
            yq, yk = _rotary.rotary_qk_cuda(xt, kt, full, full, None, False, -1)
            assert (yq.shape, yq.stride(), yk.shape, yk.stride()) == (xt.shape, xt.stride(), kt.shape, kt.stride())
        if cols >= 2:
            q, k = torch.randn(2, 4, 3, cols, dtype=dt), torch.randn(2, 2, 3, cols, dtype=dt)
            assert [t.shape for t in _rotary.rotary_qk_cuda(q, k, cos, cos, None, True, 1)] == [q.shape, k.shape]
        from opsmith.ops import _cross_entropy
        target = torch.tensor([0, cols - 1, -100])
        loss, lse, count = _cross_entropy.cross_entropy_cuda(x, target, -100, "mean", 0.1, 1e-4)
        assert loss.shape == () and lse.shape == (3,) and count.shape == (1,)
        assert _cross_entropy.cross_entropy_backward_cuda(loss, x, target, lse, count).shape == x.shape
        x2 = torch.randn(3, 2 * cols, dtype=dt)  # [gate | up]
        for op in ("silu", "gelu", "gelu_tanh"):
            y2 = fn.gated_fwd(op, x2)
            assert y2.shape == (3, cols) and fn.gated_bwd(op, y2, x2).shape == x2.shape
    for cols in (2048, 4096):  # more rows than one chunk: norm_bwd_weight's clusters (sm_90+)
        x, w = torch.randn(40, cols, dtype=dt), torch.randn(cols, dtype=dt)
        y, mean, rstd = nf.layer_norm_fwd(x, [cols], w, w, 1e-5)
        grads = nf.layer_norm_bwd(x, x, [cols], mean, rstd, True, True, w)
        assert [t.shape for t in grads] == [x.shape, w.shape, w.shape]
        y, rstd = nf.rms_norm_fwd(x, [cols], w, None)
        assert [t.shape for t in nf.rms_norm_bwd(x, x, [cols], rstd, True, w)] == [x.shape, w.shape]
    names = {n.split("<")[0] for n, _ in calls}
    want = {n.split("<")[0] for f in _sources.FILES for n in _sources.FILES[f]}
    if dtype not in ("float16", "bfloat16"):  # softmax_plan gives clusters to 16-bit rows only
        want -= {"softmax_fwd_cluster", "softmax_bwd_cluster"}
    if dtype != "float32":  # layer_norm_fwd4_plan: float rows only
        want -= {"layer_norm_fwd4"}
    else:  # ... which take this test's float widths a cluster forward would (whole vectors; 4097: clusters)
        want -= {"layer_norm_fwd_cluster"}
    assert names == want, names
    assert {c.shared_mem > 0 for n, c in calls if "_long" in n} == {True, False}
    # empty tensors launch nothing
    before = len(calls)
    fn.ew_fwd("relu", torch.empty(0, dtype=dt))
    nf.layer_norm_fwd(torch.empty(0, 8, dtype=dt), [8])
    fn.softmax_cuda(torch.empty(4, 0, dtype=dt))
    fn.gated_fwd("silu", torch.empty(0, 8, dtype=dt))
    assert len(calls) == before


def test_a_first_call_that_is_compiled_registers_the_ops_outside_the_trace(tmp_path):
    """A fresh process whose first use of opsmith.ops is inside torch.compile(fullgraph=True):
    the registration (it takes a lock) must not be traced (it was, and the compile failed)."""
    code = textwrap.dedent("""
        import torch
        from opsmith import ops
        def f(x, w):
            return (ops.softmax(ops.layer_norm(ops.gelu(x), 8, w), -1) + ops.rms_norm(ops.silu(x), (8,), w)
                    + ops.relu(x))
        x, w = torch.randn(4, 8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
        compiled = torch.compile(f, fullgraph=True, backend="eager")
        assert torch.allclose(compiled(x, w), f(x, w))
        print("ok")
    """)
    env = {**os.environ, "OPSMITH_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600,
                         check=False)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


@pytest.mark.parametrize("props", [H100, A100, SMALL], ids=["H100", "A100", "small"])
def test_softmax_plan_takes_clusters_or_the_wide_strategy_between_register_and_long_rows(props):
    """Rows beyond the register strategy: with clusters, 16-bit rows "cluster" where 2 blocks of
    ROW_THREADS hold them (2 chunks a thread backward, else WIDE_CHUNKS), persistent; else "wide" where
    WIDE_CHUNKS chunks fit LONG_THREADS threads, one block a row; everything else as row_plan."""
    limit = min(_launch.ROW_THREADS, props.max_threads_per_block)
    for rows, cols, itemsize in itertools.product((1, 300, 65536), (100, 4096, 8192, 8193, 16384, 32768, 32769,
                                                                     70000), (2, 4, 8)):
        for arrays in (1, 2):
            p, r = _launch.softmax_plan(rows, cols, itemsize, arrays, props), \
                _launch.row_plan(rows, cols, itemsize, arrays, props)
            vec = 16 // itemsize
            fits2 = -(-cols // (_launch.ROW_CHUNKS * vec)) <= 2 * limit
            fits4 = -(-cols // (_launch.WIDE_CHUNKS * vec)) <= 2 * limit
            if props.clusters and itemsize == 2 and r.strategy == "long" and (fits2 and arrays == 2 or fits4 and not fits2):
                assert p.strategy == "cluster", (rows, cols, arrays)
            if p.strategy == "cluster":
                assert props.clusters and itemsize == 2 and r.strategy == "long" and p.cluster == 2 and p.shared_mem == 0
                tpr, chunks = p.block[0], p.chunks
                # 2 chunks a thread (the backward only), else 4
                assert chunks == (_launch.ROW_CHUNKS if fits2 and arrays == 2 else _launch.WIDE_CHUNKS)
                need = -(-cols // (chunks * vec))
                assert tpr % 32 == 0 and tpr <= limit and need <= 2 * tpr < need + 64
                blocks = _launch.CLUSTER_FWD_BLOCKS if chunks == _launch.ROW_CHUNKS else 1
                resident = min(_launch.ROW_THREADS * blocks, props.max_threads_per_sm) // tpr * props.sm_count // 2
                assert p.grid == (2 * max(1, min(resident, rows)),)
                continue
            if p.strategy != "wide":
                assert p == r
                continue
            assert r.strategy == "long" and p.grid == (rows,) and p.shared_mem == 0
            tpr = p.block[0]
            assert p.block == (tpr, 1) and tpr <= min(_launch.LONG_THREADS, props.max_threads_per_block)
            assert tpr * _launch.WIDE_CHUNKS * vec >= cols > tpr * _launch.WIDE_CHUNKS * vec // 2  # the least that fits
    wide = "cluster" if props.clusters else "wide"
    assert _launch.softmax_plan(2048, 16384, 2, 1, props).strategy == "wide"  # bf16 16,384 forward: wide
    assert _launch.softmax_plan(2048, 16384, 2, 2, props).strategy == wide  # its backward: clusters
    assert _launch.softmax_plan(2048, 16384, 4, 2, props).strategy == "wide"  # fp32: wide
    assert _launch.softmax_plan(2048, 32768, 2, 1, props).strategy == wide  # bf16 32,768: 2 x 512 or 1,024 threads x 4
    assert _launch.softmax_plan(2048, 32768, 2, 2, props).strategy == wide  # the backward's too
    assert _launch.softmax_plan(2048, 32769, 2, 1, props) == _launch.row_plan(2048, 32769, 2, 1, props)  # long
    assert _launch.softmax_plan(2048, 32769, 2, 2, props) == _launch.row_plan(2048, 32769, 2, 2, props)
    assert _launch.softmax_plan(2048, 8192, 2, 1, props).strategy == "block"


@pytest.mark.parametrize("props", [H100, A100, SMALL], ids=["H100", "A100", "small"])
def test_layer_norm_forward_kernel_choice(props):
    """layer_norm_fwd_wide for block rows of LN_WIDE_TPR threads or more with 16-byte access only;
    layer_norm_fwd for warp rows, narrower block rows and element access; the long kernel for long rows."""
    for rows, cols, itemsize in itertools.product((1, 300, 65536), (1, 100, 1024, 2048, 3000, 4096, 8192, 20000),
                                                  (2, 4, 8)):
        p = _launch.row_plan(rows, cols, itemsize, 1, props)
        for vec in (True, False):
            k = _launch.layer_norm_kernel(p, vec)
            if p.strategy == "long":
                assert k == "layer_norm_fwd_long"
            elif vec and p.strategy == "block" and p.block[0] >= _launch.LN_WIDE_TPR:
                assert k == "layer_norm_fwd_wide"
            else:
                assert k == "layer_norm_fwd", (rows, cols, itemsize, vec, p)
    p = _launch.row_plan(4096, 4096, 2, 1, props)
    assert _launch.layer_norm_kernel(p, True) == "layer_norm_fwd_wide"  # bf16 4096-wide rows: 256 threads
    assert _launch.layer_norm_kernel(_launch.row_plan(65536, 1024, 2, 1, props), True) == "layer_norm_fwd"


@pytest.mark.parametrize("props", [H100, A100, SMALL], ids=["H100", "A100", "small"])
def test_norm_cluster_plan_covers_rows_between_one_block_and_eight(props):
    """norm_cluster_plan: only on devices with clusters, only for rows row_plan sends to "long": 2
    blocks of up to ROW_THREADS both ways, for rows twice as long 2 blocks of 4 chunks a thread
    forward (16-bit types) and 8 of up to CLUSTER_THREADS backward, the row spread
    evenly over whole warps; both directions run the clusters the SMs hold at once (fewer where the
    rows are fewer: a row a cluster forward, two backward); longer rows stay long."""
    limit = min(_launch.ROW_THREADS, props.max_threads_per_block)
    for rows, cols, itemsize in itertools.product((1, 7, 300, 4099, 65536), (1000, 4096, 8192, 8200, 12000, 16384,
                                                                            16392, 32768, 32776, 65536, 262144),
                                                  (2, 4, 8)):
        vec = 16 // itemsize
        units = -(-cols // (_launch.ROW_CHUNKS * vec))
        for backward in (False, True):
            plan = _launch.norm_cluster_plan(rows, cols, itemsize, props, backward)
            longest = _launch.CLUSTER_MAX * _launch.CLUSTER_THREADS if backward else \
                2 * limit * (_launch.WIDE_CHUNKS // _launch.ROW_CHUNKS if itemsize == 2 else 1)
            if not props.clusters or units <= limit or units > longest:
                assert plan is None, (rows, cols, itemsize, backward)
                continue
            assert _launch.row_plan(rows, cols, itemsize, 1, props).strategy == "long"
            k, (tpr, one), chunks = plan.cluster, plan.block, plan.chunks
            assert one == 1 and plan.shared_mem == 0
            if units <= 2 * limit:  # 2 blocks of 2 chunks a thread
                assert (k, chunks) == (2, _launch.ROW_CHUNKS)
            else:  # longer: 2 blocks of 4 chunks forward, 8 of 2 backward
                assert (k, chunks) == ((_launch.CLUSTER_MAX, 2) if backward else (2, _launch.WIDE_CHUNKS))
            assert tpr % 32 == 0 and tpr <= (limit if k == 2 else _launch.CLUSTER_THREADS)
            need = -(-cols // (chunks * vec))  # threads the row needs
            assert need <= k * tpr < need + 32 * k  # the row fits, spread evenly (whole warps a block)
            assert plan.grid[0] % k == 0
            blocks = _launch.ROW_BWD_BLOCKS if backward else _launch.CLUSTER_FWD_BLOCKS if chunks == 2 else 1
            most = -(-rows // 2) if backward else rows
            groups = plan.grid[0] // k
            resident = min(_launch.ROW_THREADS * blocks, props.max_threads_per_sm) // tpr * props.sm_count // k
            assert 1 <= groups <= max(1, resident) and groups <= max(1, most)
            if most >= resident:  # enough rows: every SM full
                assert groups == max(1, resident)


@pytest.mark.parametrize("props", [H100, A100, SMALL], ids=["H100", "A100", "small"])
def test_norm_backward_plan_is_persistent_and_its_partials_stay_small(props):
    """norm_bwd_plan on synthetic devices: few rows a block run "split" (grad_x a row a row lane,
    where the partial sums' bytes would outweigh a second read of the input; half the bytes for
    rms_norm's one array). Else register rows get a persistent grid of at most the blocks
    an SM holds at once (ROW_THREADS * ROW_BWD_BLOCKS threads: the kernels take up to 128 registers
    a thread), blocks within the kernel's limit, every row covered by the grid-stride loop, and
    partial sums (a row a block) small beside the input once the input is large; blocks of several
    rows within norm.cu's OPSMITH_BWD_BLOCK (write_partial's shared buffer; it traps beyond)."""
    import re
    source = (_sources.KERNEL_DIR / "norm.cu").read_text()
    assert int(re.search(r"#define OPSMITH_BWD_BLOCK (\d+)", source).group(1)) == _launch.NORM_BWD_BLOCK
    split = (_sources.KERNEL_DIR / "norm_split.cu").read_text()
    assert int(re.search(r"#define OPSMITH_WEIGHT_CLUSTER (\d+)", split).group(1)) == _launch.WEIGHT_CLUSTER
    for rows, cols, itemsize in itertools.product((1, 7, 300, 4099, 65536, 10**6), (1, 33, 1000, 4096, 8192, 20000),
                                                  (2, 4, 8)):
        p = _launch.norm_bwd_plan(rows, cols, itemsize, props)
        if p.strategy == "long":  # too long for registers: row_plan's long plan, norm_bwd_weight after
            assert p == _launch.row_plan(rows, cols, itemsize, 2, props)
            continue
        assert p.strategy in ("persistent", "split")
        tpr, per_block = p.block
        resident = min(_launch.ROW_THREADS * _launch.ROW_BWD_BLOCKS, props.max_threads_per_sm)
        full = max(1, resident // (tpr * per_block)) * props.sm_count  # the persistent grid with rows enough
        split_bytes = _launch.NORM_SPLIT_BYTES * max(1, min(full, -(-rows // (2 * per_block))))  # x arrays
        if p.strategy == "split":  # few rows a block: grad_x a row a row lane, every row at once
            assert p.grid[0] == -(-rows // per_block) > props.sm_count or per_block == 1
            few = -(-rows // per_block) <= props.sm_count  # a row a block fits the SMs
            assert few or rows * itemsize < 2 * split_bytes
            rms = _launch.norm_bwd_plan(rows, cols, itemsize, props, 1)  # one array of partials: half the bytes
            assert rms.strategy == ("split" if few or rows * itemsize < split_bytes else "persistent")
            continue
        assert rows * itemsize >= 2 * split_bytes and -(-rows // per_block) > props.sm_count or per_block > 1
        assert tpr * per_block <= min(_launch.ROW_THREADS, props.max_threads_per_block)
        assert per_block == 1 or tpr * per_block <= _launch.NORM_BWD_BLOCK  # write_partial's shared buffer
        assert tpr * _launch.ROW_CHUNKS * (16 // itemsize) >= cols  # a row fits a row lane's registers
        assert 1 <= p.grid[0] <= max(1, resident // (tpr * per_block)) * props.sm_count
        if rows >= 2 * per_block * props.sm_count * (resident // (tpr * per_block)):  # enough rows: every SM full
            assert p.grid[0] == max(1, resident // (tpr * per_block)) * props.sm_count
        if per_block > 1 and -(-rows // per_block) <= props.sm_count:  # few narrow rows: a row a row lane
            assert p.grid[0] == max(1, -(-rows // per_block))
        else:
            assert p.grid[0] * per_block * 2 <= rows + 2 * per_block  # at least about two rows a row lane
        if rows * cols * itemsize >= 64 << 20:  # partial sums (float) at most 1/4 of one input
            assert p.grid[0] * cols * 4 * 4 <= rows * cols * itemsize
