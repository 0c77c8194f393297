"""opsmith.ops without a GPU: every kernel source compiles through NVRTC for sm_80, sm_90 and
(slow) sm_100 in every dtype (concurrently, through compile_many), each kernel's signature takes the
right dtypes (every CUDA path's launches checked against them), compile_many's contract, the CPU
path and the CLI's `warm --ops`. The launch plans on synthetic devices: test_ops_plans.py."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import opsmith
from devices import A100, H100  # tests/ops/devices.py (pytest puts tests/ops on the path)
from launch_check import CheckedLaunch  # tests/ops/launch_check.py
from opsmith._errors import CompileError, SpecError
from opsmith.ops import _launch, _sources

ROOT = Path(__file__).resolve().parents[2]
ARCHS = ("sm_80", "sm_90", "sm_100")

TORCH_DTYPE = {"float32": "float32", "float64": "float64", "float16": "float16", "bfloat16": "bfloat16"}

pytest.importorskip("cuda.bindings.nvrtc", reason="compiling needs cuda-bindings (pip install 'opsmith[cuda]')")


def _pointer_params(kernel):
    return [p for p in kernel.params if p.kind == "tensor"]


# sm_90 and sm_80 take both sides of every `#if __CUDA_ARCH__` in the kernels (clusters or none); sm_100, which
# compiles sm_90's, adds about 80 s on CI's 2 cores: slow
@pytest.mark.parametrize("arch", ["sm_90", "sm_80", pytest.param("sm_100", marks=pytest.mark.slow)])
def test_every_source_compiles_for_every_dtype(arch):
    jobs = _sources.jobs(arch)
    binaries = opsmith.compile_many(jobs, progress=False)
    assert len(binaries) == len(_sources.FILES) * len(_sources.DTYPES)
    for job, binary in zip(jobs, binaries):
        assert binary.kind == "cubin" and binary.arch == job["arch"] and binary.code[:4] == b"\x7fELF"
        assert sorted(binary.lowered_names) == sorted(job["name_expressions"])
        assert "warning" not in binary.log.lower(), binary.log
    # every kernel's parsed signature: element pointers take the dtype, stats the accumulation dtype,
    # index tables (rotary's positions and its shape/stride table, cross_entropy's targets) int64
    if arch != "sm_90":
        return
    for dtype, (ctype, acc) in _sources.DTYPES.items():
        for file in _sources.FILES:
            binary = next(b for j, b in zip(jobs, binaries)
                          if j["source"].name == file and ctype in j["name_expressions"][0])
            module = opsmith.CudaModule(binary)
            for name in _sources.kernel_names(file, dtype):
                kernel = module.get_kernel(name)
                dts = {p.dtypes[0] for p in _pointer_params(kernel)}
                expected = {TORCH_DTYPE[dtype], "float64" if acc == "double" else "float32"}
                expected |= {"int64"} if file in ("rotary.cu", "rotary_ip.cu", "cross_entropy.cu") else set()
                assert dts <= expected, (name, dts)
                assert TORCH_DTYPE[dtype] in dts


def test_the_l2_norm_forwards_fit_their_registers_without_spilling():
    """norm_l2.cu's forwards (layer_norm, rms_norm, add_rms_norm, add_layer_norm) of B = 2 hold 2,048 threads an SM
    at 32 registers (a version that spilled, a loop over rows, ran 10-30 % slower on an H200), those of B = 1 (one
    block an SM, 4 chunks a trip) 1,024 at 33 to 64, layer_norm's and rms_norm's of B = 3 (4 chunks a trip) 3 blocks
    of 512 at up to 42 (the plans give B = 3 to the H200 only: sm_100's ptxas spills those 20-60 bytes).
    ptxas's report through NVRTC, every 2- and 4-byte type and arch: no spills for sm_80 and sm_90 (sm_100's ptxas
    spills 20 bytes in the float kernels of B = 2: unmeasured, no B200 here)."""
    import re
    jobs = [{**j, "options": ["--ptxas-options=-v"]} for arch in ARCHS
            for j in _sources.jobs(arch, ("float32", "float16", "bfloat16"), ("norm_l2.cu",))]
    for job, binary in zip(jobs, opsmith.compile_many(jobs, progress=False)):
        reports = re.findall(r"Compiling entry function '_Z\d+\w+?_fwd_l2ILi(\d)E\w*'.*?(\d+) bytes spill stores, "
                             r"(\d+) bytes spill loads\s+ptxas info\s+: Used (\d+) registers", binary.log, re.S)
        assert len(reports) == len(job["name_expressions"]) == 10, (job["arch"], binary.log)
        assert sorted(b for b, *_ in reports) == ["1"] * 4 + ["2"] * 4 + ["3"] * 2
        for blocks, stores, loads, regs in reports:
            threads = _launch.L2_THREE_THREADS if blocks == "3" else _launch.L2_THREADS  # B = 3: 3 blocks of 512
            assert int(regs) <= 65536 // (threads * int(blocks)), (job["arch"], blocks, regs)
            # B = 1: more than 32 registers, so that a second block of 1,024 threads never fits an SM's 65,536 (the
            # plans pad no shared memory; two such rows an SM overflow L2)
            assert blocks == "2" or int(regs) > 32, (job["arch"], regs)
            # B = 3 on sm_80: float layer_norm's spills 4 bytes, but its devices (A100: 14-19 GB/s an SM) never take it
            if job["arch"] != "sm_100" and (blocks, job["arch"]) != ("3", "sm_80"):
                assert (int(stores), int(loads)) == (0, 0), (job["arch"], job["name_expressions"])


def test_rotary_compiles_without_spilling():
    """rotary.cu and rotary_ip.cu (the one-modulo table rows, q and k on two grid rows or alternating) compile for
    every type on sm_90 (ptxas through NVRTC), with no spills in the 2- and 4-byte kernels, as shipped and with
    float's tables under L2 evict_last (OPSMITH_ROTARY_TABLE_HINT 1, bench/diag_rotary.py's h1)."""
    import re
    jobs = [{"source": _sources.KERNEL_DIR / f, "arch": "sm_90", "options": ["--ptxas-options=-v", *hint],
             "name_expressions": [n.format(T=t) for n in _sources.FILES[f]]}
            for hint in ([], ["-DOPSMITH_ROTARY_TABLE_HINT=1"])
            for f in ("rotary.cu", "rotary_ip.cu") for t, _ in _sources.DTYPES.values()]
    for job, binary in zip(jobs, opsmith.compile_many(jobs, progress=False)):
        spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", binary.log)
        assert len(spills) >= len(job["name_expressions"]), (job["source"].name, job["name_expressions"][0],
                                                             job["options"], binary.from_cache, binary.log)
        if "double" not in job["name_expressions"][0]:
            assert all(s == ("0", "0") for s in spills), (job["source"].name, job["name_expressions"][0], spills)


def test_rotary_table_hint_is_off_and_changes_float_kernels_alone():
    """OPSMITH_ROTARY_TABLE_HINT (float's cos/sin under L2 evict_last) is off as shipped, and switched on it changes
    the float kernels alone: the 2-byte types' cubins stay byte for byte (their registers were the reason to keep
    them out)."""
    text = (_sources.KERNEL_DIR / "rotary.cuh").read_text()
    assert "#define OPSMITH_ROTARY_TABLE_HINT 0" in text
    names = _sources.FILES["rotary.cu"]
    jobs = [{"source": _sources.KERNEL_DIR / "rotary.cu", "arch": "sm_90",
             "options": [f"-DOPSMITH_ROTARY_TABLE_HINT={h}"], "name_expressions": [n.format(T=t) for n in names]}
            for t in ("float", "__nv_bfloat16") for h in (0, 1)]
    f0, f1, b0, b1 = (binary.code for binary in opsmith.compile_many(jobs, progress=False))
    assert f0 != f1 and b0 == b1


def test_the_norm_forwards_of_four_chunks_do_not_spill():
    """norm.cu's layer_norm_fwd_c4 and rms_norm_fwd_c4 hold a thread's 4 chunks (and layer_norm's weight and
    bias after the reductions) in up to 85 registers, 3 blocks of 256 threads an SM: ptxas's report through
    NVRTC, every type and arch, no spills in the kernels for sm_80 and sm_90 (the element rows' out-of-line
    function has its own frame). sm_100's depends on the NVRTC: 13.5 spills nothing, the GPU machine's (torch
    2.11's CUDA 13) 8 bytes in rms_norm_fwd_c4<__half> (2026-11-27; unmeasured, no B200 here)."""
    import re
    names = ("layer_norm_fwd_c4<{T}, {A}>", "rms_norm_fwd_c4<{T}, {A}>")
    jobs = [{"source": _sources.KERNEL_DIR / "norm.cu", "arch": arch, "options": ["--ptxas-options=-v"],
             "name_expressions": [n.format(T=t, A=a) for n in names]}
            for arch in ARCHS for t, a in _sources.DTYPES.values()]
    for job, binary in zip(jobs, opsmith.compile_many(jobs, progress=False)):
        kernels = re.findall(r"Compiling entry function '(\w+)'[^\n]*\n[^\n]*\n\D*(\d+) bytes stack frame, (\d+) bytes "
                             r"spill stores, (\d+) bytes spill loads\s+ptxas info\s+: Used (\d+) registers", binary.log)
        assert len(kernels) == 2, (job["arch"], binary.log)
        for name, _, stores, loads, regs in kernels:
            assert "_c4" in name
            if job["arch"] != "sm_100":
                assert (int(stores), int(loads)) == (0, 0), (job["arch"], name)
            assert int(regs) <= (255 if "Idd" in name else 85), (job["arch"], name, regs)


def test_kernel_sources_need_no_cuda_headers_and_ship_as_package_data():
    text = (ROOT / "pyproject.toml").read_text()
    assert '"opsmith.ops" = ["kernels/*.cu", "kernels/*.cuh", "native/*.cpp", "native/*.h"]' in text
    names = sorted(p.name for p in _sources.KERNEL_DIR.iterdir())
    assert names == ["activations.cuh", "common.cuh", "cross_entropy.cu", "elementwise.cu", "fused_norm.cu", "gated.cu",
                     "norm.cu", "norm_bwd.cuh", "norm_cluster.cu", "norm_dx.cuh", "norm_fwd.cuh", "norm_l2.cu",
                     "norm_long.cu", "norm_small.cu", "norm_split.cu", "rotary.cu", "rotary.cuh", "rotary_ip.cu",
                     "rows.cuh", "softmax.cu", "softmax_bwd.cuh", "softmax_cluster.cu"]
    # the only includes are our own headers (common.cuh first, or rows.cuh, norm_fwd.cuh or norm_dx.cuh, which
    # include it; rotary.cuh likewise) and CUDA's fp16/bf16 headers, behind __has_include
    first = ('#include "common.cuh"', '#include "rows.cuh"', '#include "norm_fwd.cuh"', '#include "norm_dx.cuh"',
             '#include "rotary.cuh"')
    ours = {*first, '#include "activations.cuh"', '#include "norm_bwd.cuh"', '#include "softmax_bwd.cuh"'}
    for path in [*_sources.KERNEL_DIR.glob("*.cu"), *_sources.KERNEL_DIR.glob("*.cuh")]:
        includes = [line for line in path.read_text().splitlines() if line.startswith("#include")]
        if path.name == "common.cuh":
            continue
        assert set(includes) <= ours, (path.name, includes)
        assert includes[0] in first, (path.name, includes)


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


def test_softmax_cluster_launches_take_the_clusters_the_device_holds(monkeypatch):
    """softmax's persistent cluster kernels launch on no more clusters than the device holds at once
    (_functional._resident; CheckedLaunch's device holds 3): bf16 rows of 18,000 on an H100 (18,432, whole warps of
    4 chunks, takes "wide" backward), the forward's 4-block clusters and the backward's 2-block ones, checked against
    the kernels' signatures."""
    import torch
    from opsmith.ops import _functional as fn
    jobs = _sources.jobs("sm_90", ("bfloat16",), ("softmax_cluster.cu",))
    module = opsmith.CudaModule(opsmith.compile_many(jobs, progress=False)[0])
    calls: list = []
    monkeypatch.setattr(_sources, "kernel", lambda file, name, dt, device: CheckedLaunch(
        module.get_kernel(name.format(T="__nv_bfloat16")), calls))
    monkeypatch.setattr(_launch, "device_props", lambda device: H100)
    x = torch.randn(64, 18000, dtype=torch.bfloat16)
    fn.softmax_fwd(x)
    fn.softmax_bwd(x, x)
    fwd, bwd = (_launch.softmax_plan(64, 18000, 2, arrays, H100) for arrays in (1, 2))
    assert (fwd.cluster, bwd.cluster) == (4, 2) and fwd.grid[0] > 12 and bwd.grid[0] > 6  # the plans' own grids
    assert [(name.split("<")[0], cfg.grid) for name, cfg in calls] == [
        ("softmax_fwd_cluster", (12, 1, 1)), ("softmax_bwd_cluster", (6, 1, 1))]


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
    from opsmith.ops import _rotary
    monkeypatch.setattr(_rotary, "LEAN_DTYPES", ("float32",))  # as shipped, whatever the default
    dt = getattr(torch, dtype)
    # warp, block, c4 and wide (the norms' 2 to 16 KiB), l2 (whole vectors from 16 KiB), cluster, long cached (its
    # forward), long uncached: the odd widths of the c4 and l2 rows take the others
    for cols in (1, 100, 1024, 3000, 6000, 6001, 12000, 12001, 20000, 40000, 40001, 70000, 70001):
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
            dx, dw, db = nf.layer_norm_bwd(x, x, [cols], mean, rstd, weight is not None, bias is not None, weight,
                                           x)  # add_layer_norm's: the residual's gradient (the *_res kernels)
            assert dx.shape == x.shape
            y, rstd = nf.rms_norm_fwd(x, [cols], weight, None)
            dx, dw = nf.rms_norm_bwd(x, x, [cols], rstd, weight is not None, weight)
        if cols in (100, 3000):  # one row: the split backwards write the weight gradients themselves
            x1 = x[:1]
            for weight, bias in ((w, b), (None, None), (w, None)):
                y, mean, rstd = nf.layer_norm_fwd(x1, [cols], weight, bias, 1e-5)
                got = nf.layer_norm_bwd(x1, x1, [cols], mean, rstd, weight is not None, bias is not None, weight)
                assert [t.shape for t in got] == [x1.shape, w.shape if weight is not None else (0,),
                                                  b.shape if bias is not None else (0,)]
                y, rstd = nf.rms_norm_fwd(x1, [cols], weight, None)
                got = nf.rms_norm_bwd(x1, x1, [cols], rstd, weight is not None, weight)
                assert [t.shape for t in got] == [x1.shape, w.shape if weight is not None else (0,)]
        if cols == 6000:  # a misaligned row of whole vectors: layer_norm_fwd4 (float), not l2
            xm = torch.randn(3 * cols + 1, dtype=dt)[1:].view(3, cols)
            nf.layer_norm_fwd(xm, [cols], w, b, 1e-5)
            nf.rms_norm_fwd(xm, [cols], w, None)
        for weight in (w, None):
            from opsmith.ops import _fused
            y, s, rstd = _fused.add_rms_norm_cuda(x, x, [cols], weight, None)
            assert y.shape == s.shape == x.shape and rstd.shape == (3,)
            y, s, mean, rstd = _fused.add_layer_norm_cuda(x, x, [cols], weight, weight, 1e-5)
            assert y.shape == s.shape == x.shape and mean.shape == rstd.shape == (3,)
        from opsmith.ops import _rotary, _rotary_inplace
        if cols >= 2:
            half = cols // 2
            cos = torch.randn(3, half, dtype=dt)
            assert _rotary.rotary_cuda(x, cos, cos, None, False, 1).shape == x.shape
            assert _rotary.rotary_cuda(x, cos, cos, torch.tensor([2, 0, 1]), True, -1).shape == x.shape
            _rotary_inplace.rotary_inplace_cuda(x.clone(), cos, cos, None, False, 1)  # rotary_ip
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
            _rotary_inplace.rotary_inplace_cuda(xt.clone().transpose(1, 2).contiguous().transpose(1, 2), full, full, None,
                                        False, 1)  # rotary_ip_full on the transposed view itself
            _rotary_inplace.rotary_qk_inplace_cuda(xt, kt, full, full, None, False, -1)  # rotary_qk_ip_full
        if cols >= 2:
            q, k = torch.randn(2, 4, 3, cols, dtype=dt), torch.randn(2, 2, 3, cols, dtype=dt)
            assert [t.shape for t in _rotary.rotary_qk_cuda(q, k, cos, cos, None, True, 1)] == [q.shape, k.shape]
            _rotary_inplace.rotary_qk_inplace_cuda(q, k, cos, cos, None, True, 1)  # rotary_qk_ip
        from opsmith.ops import _cross_entropy
        target = torch.tensor([0, cols - 1, -100])
        loss, lse, count = _cross_entropy.cross_entropy_cuda(x, target, -100, "mean", 0.1, 1e-4)
        assert loss.shape == () and lse.shape == (3,) and count.shape == (1,)
        assert _cross_entropy.cross_entropy_backward_cuda(loss, x, target, lse, count).shape == x.shape
        x2 = torch.randn(3, 2 * cols, dtype=dt)  # [gate | up]
        for op in ("silu", "gelu", "gelu_tanh"):
            y2 = fn.gated_fwd(op, x2)
            assert y2.shape == (3, cols) and fn.gated_bwd(op, y2, x2).shape == x2.shape
    assert fn.softmax_cuda(torch.randn(2, 64, dtype=dt), -1).shape == (2, 64)  # softmax_fwd_full's warp rows
    full = _launch.WIDE3_THREADS * _launch.WIDE_CHUNKS * (16 // dt.itemsize)  # softmax_fwd_wide3_full's rows
    assert fn.softmax_cuda(torch.randn(2, full, dtype=dt), -1).shape == (2, full)
    for cols in (2048, 4096, 8192):  # more rows than one chunk, rows too wide for "small" (from 2 KiB of bf16
        # threads a row): norm_bwd_weight's clusters (sm_90+) after the "split" grad_x
        x, w = torch.randn(40, cols, dtype=dt), torch.randn(cols, dtype=dt)
        y, mean, rstd = nf.layer_norm_fwd(x, [cols], w, w, 1e-5)
        grads = nf.layer_norm_bwd(x, x, [cols], mean, rstd, True, True, w)
        assert [t.shape for t in grads] == [x.shape, w.shape, w.shape]
        y, rstd = nf.rms_norm_fwd(x, [cols], w, None)
        assert [t.shape for t in nf.rms_norm_bwd(x, x, [cols], rstd, True, w)] == [x.shape, w.shape]
        from opsmith.ops import _fused  # 16-bit rows of 4,096: add_layer_norm_fwd_c4_full
        assert [t.shape for t in _fused.add_layer_norm_cuda(x, x, [cols], w, w, 1e-5)[:2]] == [x.shape, x.shape]
    x, w = torch.randn(_launch.SMALL_BWD_ROWS + 100, 256, dtype=dt), torch.randn(256, dtype=dt)  # more rows than
    y, mean, rstd = nf.layer_norm_fwd(x, [256], w, w, 1e-5)  # "small" takes: the persistent backwards (norm.cu)
    assert [t.shape for t in nf.layer_norm_bwd(x, x, [256], mean, rstd, True, True, w)] == [x.shape, w.shape, w.shape]
    got = nf.layer_norm_bwd(x, x, [256], mean, rstd, True, True, w, x)  # add_layer_norm's: layer_norm_bwd_res
    assert [t.shape for t in got] == [x.shape, w.shape, w.shape]
    if dtype != "float64":  # rows of BWD_SM_THREADS that fill them: the persistent backwards at two blocks an SM
        cols = _launch.BWD_SM_THREADS * _launch.ROW_CHUNKS * (16 // dt.itemsize)
        xs, ws = torch.randn(2000, cols, dtype=dt), torch.randn(cols, dtype=dt)
        y, mean, rstd = nf.layer_norm_fwd(xs, [cols], ws, ws, 1e-5)
        start = len(calls)
        for res in (None, xs):  # float: layer_norm_bwd_sm, layer_norm_bwd_sm_res (add_layer_norm's)
            got = nf.layer_norm_bwd(xs, xs, [cols], mean, rstd, True, True, ws, res)
            assert [t.shape for t in got] == [xs.shape, ws.shape, ws.shape]
        y, rstd = nf.rms_norm_fwd(xs, [cols], ws, None)
        assert [t.shape for t in nf.rms_norm_bwd(xs, xs, [cols], rstd, True, ws)] == [xs.shape, ws.shape]
        sm = [(n.split("<")[0], c.shared_mem > 0) for n, c in calls[start:] if "_bwd_sm" in n]
        want_sm = [("layer_norm_bwd_sm", True), ("layer_norm_bwd_sm_res", True)] * (dtype == "float32")
        assert sm == want_sm + [("rms_norm_bwd_sm", True)], sm  # 16-bit layer_norm: the one-block kernels
    from opsmith.ops import _fused
    y, s, mean, rstd = _fused.add_layer_norm_cuda(x, x, [256], w, w, 1e-5)  # 2 chunks that fill the row (_full)
    assert y.shape == s.shape == x.shape and mean.shape == rstd.shape == (x.shape[0],)
    y, rstd = nf.rms_norm_fwd(x, [256], w, None)
    assert [t.shape for t in nf.rms_norm_bwd(x, x, [256], rstd, True, w)] == [x.shape, w.shape]
    if dtype == "float32":  # softmax's float backward of 32,768 that fill 8 chunks: grad_y staged in shared memory
        ys = torch.randn(2, 32768, dtype=dt)
        start = len(calls)
        assert fn.softmax_bwd(ys, ys).shape == ys.shape
        assert [(n.split("<")[0], c.shared_mem) for n, c in calls[start:]] == [("softmax_bwd_wide_sm", 131072)]
    names = {n.split("<")[0] for n, _ in calls}
    want = {n.split("<")[0] for f in _sources.FILES for n in _sources.FILES[f]}
    if dtype != "float32":  # _launch._staged: float rows only
        want -= {"softmax_bwd_wide_sm"}
    if dtype not in ("float16", "bfloat16"):  # softmax_plan gives clusters to 16-bit rows only
        want -= {"softmax_fwd_cluster", "softmax_bwd_cluster"}
        want -= {"layer_norm_fwd_full"}  # layer_norm_full2_plan: 16-bit rows of 2 to 4 KiB
    if dtype != "float32":  # layer_norm_fwd4_plan, norm_bwd_c4_plan: float rows only
        want -= {"layer_norm_fwd4", "layer_norm_bwd_c4", "layer_norm_bwd_c4_res", "rms_norm_bwd_c4"}
        want -= {"layer_norm_bwd_sm", "layer_norm_bwd_sm_res"}  # norm_bwd_sm_plan: float layer_norm only
    if dtype == "float64":  # norm_l2_plan, norm_c8_plan, add_rms_c8_plan, norm_c4_plan, norm_bwd_sm_plan: 2- and 4-byte
        want -= {"layer_norm_bwd_sm", "layer_norm_bwd_sm_res", "rms_norm_bwd_sm",
                 "add_layer_norm_fwd_c4", "add_layer_norm_fwd_c4_full", "layer_norm_fwd_l2", "rms_norm_fwd_l2",
                 "add_rms_norm_fwd_l2", "add_layer_norm_fwd_l2", "layer_norm_fwd_c8", "rms_norm_fwd_c8",
                 "add_rms_norm_fwd_c8", "add_rms_norm_fwd_c8k"}
    if dtype != "bfloat16":  # norm_c4_plan: rms_norm's 2-byte rows, layer_norm's 2- and 4-byte ones (and full)
        want -= ({"rms_norm_fwd_c4", "rms_norm_fwd_c4_full"} if dtype == "float32" else
                 {"rms_norm_fwd_c4", "layer_norm_fwd_c4", "rms_norm_fwd_c4_full", "layer_norm_fwd_c4_full"})
        want -= {"softmax_fwd_wide_full"}  # softmax_plan's "wide" forward rows of up to C4_THREADS: 16-bit
    if dtype != "float64":  # the wide rows (2 KiB and more) of 2- and 4-byte types take layer_norm_fwd_c4 or l2
        want -= {"layer_norm_fwd_wide"}
    if dtype == "float64":  # _launch.softmax_fwd_wide3: 2- and 4-byte types
        want -= {"softmax_fwd_wide3", "softmax_fwd_wide3_full"}
    if dtype != "float32":  # _rotary.lean (LEAN_DTYPES set above): rotary_lean for float32's common case alone
        want -= {"rotary_lean"}
    if dtype not in ("float16", "bfloat16"):  # gated_one: silu and the tanh GELU on 16-bit types only
        want -= {f"{op}_and_mul_{d}_one" for op in ("silu", "gelu_tanh") for d in ("fwd", "bwd")}
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

