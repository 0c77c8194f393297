"""norm_l2.cu's B = 1 forwards (layer_norm, rms_norm) at fp32 rows of 96-128 KiB: 8 chunks a trip (U8, inductor's
whole row a thread's loads), no shared-memory padding (nopad: 48-64 registers keep a second block of 1,024 out
anyway, and L1 keeps its size), w/b loaded with L2 evict_last (wbkeep), and their combinations; copy and
torch.compile beside. opsmith.ops.benchmark median (L2 flushed), 3 rounds."""
import json, os, statistics, torch
import torch.nn.functional as F
from opsmith import ops
from opsmith._runtime import _driver
from opsmith._torch._cuda_module import CudaModule
from opsmith._runtime._launch_config import LaunchConfig
from opsmith.ops import _norms, _sources, _launch, _launch_norm

SRC = (_sources.KERNEL_DIR / "norm_l2.cu").read_text()
U8 = ("#define OPSMITH_L2_UNROLL_ONE 4", "#define OPSMITH_L2_UNROLL_ONE 8")
W = ("has_w ? *reinterpret_cast<const Raw*>(w + j) : Raw{}", "has_w ? ld_l2(w + j, keep) : Raw{}")
B = ("has_b ? *reinterpret_cast<const Raw*>(b + j) : Raw{}", "has_b ? ld_l2(b + j, keep) : Raw{}")
RMS_KEEP = ("rms_scale_pass<U, false>(xr, w, yr, rs, has_w, nv, tpr, t, first);",
            "rms_scale_pass<U, false>(xr, w, yr, rs, has_w, nv, tpr, t, first, keep);")
SIG = ("int has_w, int nv, int tpr, int t, unsigned long long pol) {",
       "int has_w, int nv, int tpr, int t, unsigned long long pol, unsigned long long keep = 0) {")


def src(u8=False, wb=False):
    s = SRC
    if u8:
        s = s.replace(*U8)
    if wb:  # rms_scale_pass has no `keep`: pass it
        s = s.replace(*W).replace(*B).replace(*RMS_KEEP).replace(*SIG)
        s = s.replace("rms_scale_pass<U, true>(sr, w, yr, rs, has_w, nv, tpr, t, first);",
                      "rms_scale_pass<U, true>(sr, w, yr, rs, has_w, nv, tpr, t, first, keep);")
    assert s != SRC or not (u8 or wb)
    return s


arch = _driver.device_arch(0)
names = ["layer_norm_fwd_l2<1, float, float>", "rms_norm_fwd_l2<1, float, float>"]
ks = {}
for tag, kw in (("base", {}), ("U8", {"u8": True}), ("wb", {"wb": True}), ("U8wb", {"u8": True, "wb": True})):
    m = CudaModule(src(**kw), name_expressions=names, arch=arch, name=f"probe/ln2_{tag}.cu",
                   include_paths=[str(_sources.KERNEL_DIR)])
    ks[tag] = [m.get_kernel(n) for n in names]
    print(tag, [(k.attributes.registers, k.attributes.local_bytes) for k in ks[tag]])
props = _launch.device_props(0)
out = []
for rows, cols in ((2048, 32768), (4096, 32768), (4096, 24576)):
    x = torch.randn(rows, cols, device="cuda") * 3 + 1
    w, b = torch.randn(cols, device="cuda"), torch.randn(cols, device="cuda")
    y = torch.empty_like(x); mean, rstd = torch.empty(rows, device="cuda"), torch.empty(rows, device="cuda")
    plan = _launch_norm.norm_l2_plan(rows, cols, 4, props)
    assert plan.shared_mem and plan.block == (1024, 1), plan
    pad, nopad = LaunchConfig(plan.grid, plan.block, plan.shared_mem), LaunchConfig(plan.grid, plan.block, 0)
    ln_c = torch.compile(lambda x, w, b: F.layer_norm(x, (cols,), w, b, 1e-5), dynamic=False)
    rms_c = torch.compile(lambda x, w: F.rms_norm(x, (cols,), w, 1e-6), dynamic=False)
    z = torch.empty_like(x)
    for op in ("layer_norm", "rms_norm"):
        if op == "layer_norm":
            want = F.layer_norm(x.double(), (cols,), w.double(), b.double(), 1e-5)
            calls = {"ship": lambda: _norms.layer_norm_fwd(x, [cols], w, b, 1e-5), "compile": lambda: ln_c(x, w, b)}
            args = (x, w, b, y, mean, rstd, rows, cols, 1e-5, 1, 1)
        else:
            want = F.rms_norm(x.double(), (cols,), w.double(), 1e-6)
            calls = {"ship": lambda: _norms.rms_norm_fwd(x, [cols], w, 1e-6), "compile": lambda: rms_c(x, w)}
            args = (x, w, y, rstd, rows, cols, 1e-6, 1)
        calls["copy"] = lambda: z.copy_(x)
        i = 0 if op == "layer_norm" else 1
        for tag, kk in ks.items():
            for pn, cfg in (("", pad), ("-nopad", nopad)):
                calls[tag + pn] = lambda k=kk[i], cfg=cfg, args=args: k.launch(cfg, *args)
        for n, fn in calls.items():
            y.zero_(); fn(); torch.cuda.synchronize()
            if n not in ("ship", "compile", "copy"):
                torch.testing.assert_close(y.double(), want, atol=1e-4, rtol=1e-4, msg=n)
        per = {n: [] for n in calls}
        for r in range(3):
            nm = list(calls)
            for n in nm[r:] + nm[:r]:
                per[n].append(ops.benchmark(calls[n], runs=40).median_ms * 1e3)
        line = f"{op:10} fp32 {rows}x{cols}"
        cp = statistics.median(per["copy"])
        for n, us in per.items():
            med = statistics.median(us)
            out.append({"op": op, "shape": [rows, cols], "variant": n, "us": med, "gbps": 2 * x.nbytes / med / 1e3,
                        "rounds_us": us})
            line += f" | {n} {2 * x.nbytes / med / 1e3:4.0f} ({cp / med:4.2f})"
        print(line, flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "ln2.json"), "w"), indent=1)
