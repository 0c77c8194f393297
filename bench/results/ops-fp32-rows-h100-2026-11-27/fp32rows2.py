"""Follow-up of fp32rows.py, H100: (1) the cluster backwards' grid (clusters) swept, with the driver's
cuOccupancyMaxActiveClusters; (2) the L2 forwards at one block of 1,024 threads an SM (dynamic shared memory
padding) across row widths, float32 and bf16, against the shipped plans. L2 flushed, opsmith.ops.benchmark
median of 50, 3 rounds in turn."""
import json, os, statistics
import torch
from cuda.bindings import driver as drv
from opsmith import ops
from opsmith.ops import _norms, _sources, _launch, _fused
from opsmith._runtime._launch_config import LaunchConfig

CL = "norm_cluster.cu"
extra = tuple(f"{op}_bwd_cluster<{k}, {{T}}, {{A}}>" for op in ("layer_norm", "rms_norm") for k in (4, 8))
_sources.FILES[CL] = tuple(dict.fromkeys(_sources.FILES[CL] + extra))
props = _launch.device_props(0)
out = []


def run(label, shape, calls, nbytes):
    per = {n: [] for n in calls}
    for r in range(3):
        names = list(calls)
        for n in names[r % len(names):] + names[:r % len(names)]:
            per[n].append(ops.benchmark(calls[n], runs=50).median_ms * 1e3)
    for n, us in per.items():
        med = statistics.median(us)
        out.append({"case": label, "shape": list(shape), "variant": n, "us": med, "gbps": nbytes / med / 1e3,
                    "rounds_us": us})
        print(f"{label:18} {shape[0]}x{shape[1]} {n:28} {med:8.1f} us {nbytes / med / 1e3:6.0f} GB/s", flush=True)


def max_clusters(k, grid, tpr):
    fn = next(iter(k._states.values())).fn
    cfg = drv.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid, 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = tpr, 1, 1
    cfg.sharedMemBytes = 0
    err, n = drv.cuOccupancyMaxActiveClusters(drv.CUfunction(fn), cfg)
    return n if err == drv.CUresult.CUDA_SUCCESS else str(err)


def bwd_cases(rows, cols, kk, groups_list):
    x = torch.randn(rows, cols, device="cuda"); g = torch.randn_like(x); gres = torch.randn_like(x)
    w = torch.randn(cols, device="cuda"); b = torch.randn(cols, device="cuda")
    _, rstd = _norms.rms_norm_fwd(x, [cols], w, 1e-6)
    _, mean, lrstd = _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)
    orig, cmax = _launch.norm_cluster_plan, _launch.CLUSTER_MAX

    def with_plan(plan, fn):
        def call():
            _launch.norm_cluster_plan = lambda r, c, i, p, bwd: plan if bwd else orig(r, c, i, p, bwd)
            _launch.CLUSTER_MAX = 99
            try:
                return fn()
            finally:
                _launch.norm_cluster_plan, _launch.CLUSTER_MAX = orig, cmax
        return call

    tpr = -(-cols // (kk * 8))
    cases = {
        "rms": (lambda: _norms.rms_norm_bwd(g, x, [cols], rstd, True, w), 3 * x.nbytes, "rms_norm"),
        "add_rms": (lambda: _norms.rms_norm_bwd(g, x, [cols], rstd, True, w, gres), 4 * x.nbytes, "rms_norm"),
        "ln": (lambda: _norms.layer_norm_bwd(g, x, [cols], mean, lrstd, True, True, w), 3 * x.nbytes, "layer_norm"),
    }
    for key, (shipped, nbytes, op) in cases.items():
        want = [t.clone() for t in shipped()]
        calls = {"shipped": shipped}
        for groups in groups_list:
            plan = _launch.Plan("cluster", (groups * kk,), (tpr, 1), 0, 0, kk, 2)
            calls[f"K{kk} {tpr}t g{groups}"] = with_plan(plan, shipped)
        for n, f in calls.items():
            got = f(); torch.cuda.synchronize()
            for a, e in zip(got, want):
                torch.testing.assert_close(a, e, atol=2e-3, rtol=2e-3, msg=f"{key} {n}")
        k = _norms._kernel(CL, f"{op}_bwd_cluster<{kk}, {{T}}, {{A}}>", x)
        print(key, f"K{kk} {tpr}t max active clusters", max_clusters(k, 132 * kk, tpr), flush=True)
        run(f"bwd {key}", (rows, cols), calls, nbytes)


def fwd_cases(rows, cols, dtype):
    x = torch.randn(rows, cols, device="cuda", dtype=dtype); res = torch.randn_like(x)
    w = torch.randn(cols, device="cuda", dtype=dtype)
    y, s = torch.empty_like(x), torch.empty_like(x)
    rstd = torch.empty(rows, device="cuda")
    one = props.smem_per_sm // 2 + 1024
    cases = {"rms": (lambda: _norms.rms_norm_fwd(x, [cols], w, 1e-6), "rms_norm", (x, w, y, rstd, rows, cols, 1e-6, 1),
                     2 * x.nbytes),
             "add_rms": (lambda: _fused.add_rms_norm_cuda(x, res, [cols], w, 1e-6), "add_rms_norm",
                         (x, res, w, y, s, rstd, rows, cols, 1e-6, 1), 4 * x.nbytes)}
    for key, (shipped, op, args, nbytes) in cases.items():
        want = shipped()[0].clone()
        k = _norms._kernel("norm_l2.cu", f"{op}_fwd_l2<{{T}}, {{A}}>", x)
        calls = {"shipped": shipped}
        for tpr in (1024, 512):
            if cols // (16 // x.element_size()) >= 2 * tpr:
                calls[f"l2 {tpr}t 1/SM"] = (lambda cfg=LaunchConfig((rows,), (tpr,), one): k.launch(cfg, *args))
        for n, f in calls.items():
            y.zero_(); f(); torch.cuda.synchronize()
            if n != "shipped":
                torch.testing.assert_close(y, want, atol=1e-2, rtol=1e-2, msg=f"{key} {n}")
        run(f"fwd {key} {str(dtype)[6:]}", (rows, cols), calls, nbytes)


bwd_cases(2048, 32768, 8, (12, 14, 16, 20, 24, 28, 33, 49, 66))
bwd_cases(4096, 16384, 8, (16, 24, 28, 33, 49, 66, 99, 132))
bwd_cases(4096, 16384, 4, (33, 49, 66, 99))
for rows, cols in ((4096, 20480), (2048, 24576), (4096, 24576), (2048, 32768), (4096, 32768), (8192, 16384)):
    fwd_cases(rows, cols, torch.float32)
for rows, cols in ((2048, 65536), (4096, 32768)):
    fwd_cases(rows, cols, torch.bfloat16)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "fp32rows2.json"), "w"), indent=1)
