"""The float32 norms' rows of 64 and 128 KiB (4096x16384, 2048x32768), H100: forward and backward variants
against the shipped plans. Forward: the L2 rows (norm_l2.cu) at other block sizes and blocks an SM (dynamic
shared memory padding caps the blocks an SM), and the cluster forwards (norm_cluster.cu) at K = 4 / 8.
Backward: the cluster backwards at K = 4 / 8 of up to 512 threads, through the shipped Python path with
norm_cluster_plan replaced. L2 flushed, opsmith.ops.benchmark median of 50, 3 rounds in turn."""
import json, os, statistics
import torch
from opsmith import ops
from opsmith.ops import _norms, _sources, _launch, _fused
from opsmith._runtime._launch_config import LaunchConfig

CL = "norm_cluster.cu"
FWD_KC = ((2, 4), (4, 2), (4, 4), (8, 2), (8, 4))
extra = tuple(f"{op}_fwd_cluster<{k}, {c}, {{T}}, {{A}}>" for op in ("layer_norm", "rms_norm", "add_rms_norm")
              for k, c in FWD_KC) + tuple(f"{op}_bwd_cluster<{k}, {{T}}, {{A}}>" for op in ("layer_norm", "rms_norm")
                                          for k in (2, 4, 8))
_sources.FILES[CL] = tuple(dict.fromkeys(_sources.FILES[CL] + extra))
props = _launch.device_props(0)
SMEM = {1: 120 * 1024, 2: 80 * 1024, 0: 0}
out = []


def regs(k):
    try:
        st = next(iter(k._states.values()))
        return st.attrs.registers, st.attrs.local_bytes
    except Exception as e:  # noqa: BLE001
        return str(e)


def run(label, shape, calls, nbytes, ref=None):
    per = {n: [] for n in calls}
    for r in range(3):
        names = list(calls)
        for n in names[r % len(names):] + names[:r % len(names)]:
            per[n].append(ops.benchmark(calls[n], runs=50).median_ms * 1e3)
    for n, us in per.items():
        med = statistics.median(us)
        out.append({"case": label, "shape": list(shape), "variant": n, "us": med, "gbps": nbytes / med / 1e3,
                    "rounds_us": us})
        print(f"{label:16} {shape[0]}x{shape[1]} {n:28} {med:8.1f} us {nbytes / med / 1e3:6.0f} GB/s", flush=True)


kern = {}


def fwd_cases(rows, cols):
    x = torch.randn(rows, cols, device="cuda"); res = torch.randn_like(x)
    w = torch.randn(cols, device="cuda"); b = torch.randn(cols, device="cuda")
    y, s = torch.empty_like(x), torch.empty_like(x)
    mean, rstd = torch.empty(rows, device="cuda"), torch.empty(rows, device="cuda")
    ops_ = {
        "rms": (lambda: _norms.rms_norm_fwd(x, [cols], w, 1e-6), "rms_norm", (x, w, y, rstd, rows, cols, 1e-6, 1),
                2 * x.nbytes, lambda: y),
        "ln": (lambda: _norms.layer_norm_fwd(x, [cols], w, b, 1e-5), "layer_norm",
               (x, w, b, y, mean, rstd, rows, cols, 1e-5, 1, 1), 2 * x.nbytes, lambda: y),
        "add_rms": (lambda: _fused.add_rms_norm_cuda(x, res, [cols], w, 1e-6), "add_rms_norm",
                    (x, res, w, y, s, rstd, rows, cols, 1e-6, 1), 4 * x.nbytes, lambda: y),
    }
    for key, (shipped, op, args, nbytes, got) in ops_.items():
        want = shipped()[0].clone()
        calls = {"shipped": shipped}
        for tpr, bps in ((1024, 1), (512, 1), (512, 2), (512, 0), (256, 0)):
            k = _norms._kernel("norm_l2.cu", f"{op}_fwd_l2<{{T}}, {{A}}>", x)
            cfg = LaunchConfig((rows,), (tpr,), SMEM[bps])
            calls[f"l2 {tpr}t {bps or 'any'}/SM"] = (lambda k=k, cfg=cfg: k.launch(cfg, *args))
        for kk, c in FWD_KC:
            tpr = -(-cols // (kk * c * 4))
            if tpr > 512 or tpr % 32:
                continue
            k = _norms._kernel(CL, f"{op}_fwd_cluster<{kk}, {c}, {{T}}, {{A}}>", x)
            plan = _launch._cluster(rows, cols, 4, props, kk, c, 1 if c > 2 else 2, rows)
            calls[f"cluster K{kk} C{c} {tpr}t g{plan.grid[0] // kk}"] = (
                lambda k=k, cfg=_launch.launch_config(plan): k.launch(cfg, *args))
            kern[f"{key} K{kk} C{c}"] = k
        for n, f in calls.items():
            y.zero_(); f(); torch.cuda.synchronize()
            if n != "shipped":
                torch.testing.assert_close(got(), want, atol=1e-4, rtol=1e-4, msg=f"{key} {n}")
        run(f"fwd {key}", (rows, cols), calls, nbytes)


def bwd_cases(rows, cols):
    x = torch.randn(rows, cols, device="cuda"); g = torch.randn_like(x); gres = torch.randn_like(x)
    w = torch.randn(cols, device="cuda"); b = torch.randn(cols, device="cuda")
    _, rstd = _norms.rms_norm_fwd(x, [cols], w, 1e-6)
    _, mean, lrstd = _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)
    orig = _launch.norm_cluster_plan
    cmax = _launch.CLUSTER_MAX

    def with_plan(plan, fn):
        def call():
            _launch.norm_cluster_plan = lambda r, c, i, p, bwd: plan if bwd else orig(r, c, i, p, bwd)
            _launch.CLUSTER_MAX = 99
            try:
                return fn()
            finally:
                _launch.norm_cluster_plan = orig
                _launch.CLUSTER_MAX = cmax
        return call

    cases = {
        "rms": (lambda: _norms.rms_norm_bwd(g, x, [cols], rstd, True, w), 3 * x.nbytes),
        "add_rms": (lambda: _norms.rms_norm_bwd(g, x, [cols], rstd, True, w, gres), 4 * x.nbytes),
        "ln": (lambda: _norms.layer_norm_bwd(g, x, [cols], mean, lrstd, True, True, w), 3 * x.nbytes),
    }
    for key, (shipped, nbytes) in cases.items():
        want = [t.clone() for t in shipped()]
        calls = {"shipped": shipped}
        for kk in (2, 4, 8):
            tpr = -(-cols // (kk * 2 * 4))
            if tpr > 512:
                continue
            for blocks in (1, 2):
                plan = _launch._cluster(rows, cols, 4, props, kk, 2, blocks, -(-rows // 2))
                calls[f"cluster K{kk} {tpr}t g{plan.grid[0] // kk}"] = with_plan(plan, shipped)
        for n, f in calls.items():
            got = f(); torch.cuda.synchronize()
            for a, e in zip(got, want):
                torch.testing.assert_close(a, e, atol=2e-3, rtol=2e-3, msg=f"{key} {n}")
        run(f"bwd {key}", (rows, cols), calls, nbytes)
    for n in ("layer_norm", "rms_norm"):
        for kk in (2, 4, 8):
            try:
                k = _norms._kernel(CL, f"{n}_bwd_cluster<{kk}, {{T}}, {{A}}>", x)
                print(n, "bwd K", kk, regs(k), flush=True)
            except Exception as e:  # noqa: BLE001
                print(n, kk, e)


for shape in ((4096, 16384), (2048, 32768)):
    fwd_cases(*shape)
    bwd_cases(*shape)
for n, k in kern.items():
    print("fwd", n, regs(k))
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "fp32rows.json"), "w"), indent=1)
