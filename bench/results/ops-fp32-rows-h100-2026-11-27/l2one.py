"""The norms' L2 forwards at one block of 1,024 threads an SM with more chunks' loads in flight: norm_l2.cu
compiled with __launch_bounds__(1024, 1) (up to 64 registers) and OPSMITH_L2_UNROLL = U (add_rms_norm's kernel too,
which takes 1), U = 2, 4, 8, against the shipped plans (this tree: rms_norm's rows past 96 KiB at one block, U = 2;
layer_norm two blocks). L2 flushed, opsmith.ops.benchmark median of 50, 3 rounds in turn; H100."""
import json, os, statistics
import torch
from opsmith import ops
from opsmith._runtime import _driver
from opsmith._torch._cuda_module import CudaModule
from opsmith._runtime._launch_config import LaunchConfig
from opsmith.ops import _norms, _sources, _fused, _launch

SRC = (_sources.KERNEL_DIR / "norm_l2.cu").read_text()
assert SRC.count("2048 / OPSMITH_L2_THREADS") == 3 and "OPSMITH_L2_ROW_U(1)" in SRC
mods = {}
for dt in ("float", "__nv_bfloat16"):
    for u in (2, 4, 8):
        src = SRC.replace("2048 / OPSMITH_L2_THREADS", "1").replace("#define OPSMITH_L2_UNROLL 2",
                                                                    f"#define OPSMITH_L2_UNROLL {u}")
        src = src.replace("OPSMITH_L2_ROW_U(1)", "OPSMITH_L2_ROW")
        names = [f"{k}_fwd_l2<{dt}, float>" for k in ("rms_norm", "layer_norm", "add_rms_norm")]
        m = CudaModule(src, name_expressions=names, arch=_driver.device_arch(0), name=f"diag/l2one_u{u}.cu",
                       include_paths=[str(_sources.KERNEL_DIR)])
        mods[(dt, u)] = {n.split("_fwd")[0]: m.get_kernel(n) for n in names}
props = _launch.device_props(0)
one = props.smem_per_sm // 2 + 1024
out = []
for dtype, rows, cols in ((torch.float32, 2048, 32768), (torch.float32, 4096, 32768), (torch.float32, 4096, 24576),
                          (torch.float32, 4096, 20480), (torch.float32, 4096, 16384), (torch.bfloat16, 2048, 65536)):
    dt = "float" if dtype == torch.float32 else "__nv_bfloat16"
    x = torch.randn(rows, cols, device="cuda", dtype=dtype); res = torch.randn_like(x)
    w = torch.randn(cols, device="cuda", dtype=dtype); b = torch.randn(cols, device="cuda", dtype=dtype)
    y, s = torch.empty_like(x), torch.empty_like(x)
    mean, rstd = torch.empty(rows, device="cuda"), torch.empty(rows, device="cuda")
    cases = {"rms_norm": (lambda: _norms.rms_norm_fwd(x, [cols], w, 1e-6), (x, w, y, rstd, rows, cols, 1e-6, 1), 2),
             "layer_norm": (lambda: _norms.layer_norm_fwd(x, [cols], w, b, 1e-5),
                            (x, w, b, y, mean, rstd, rows, cols, 1e-5, 1, 1), 2),
             "add_rms_norm": (lambda: _fused.add_rms_norm_cuda(x, res, [cols], w, 1e-6),
                              (x, res, w, y, s, rstd, rows, cols, 1e-6, 1), 4)}
    for op, (shipped, args, units) in cases.items():
        want = shipped()[0].clone()
        calls = {"shipped": shipped}
        for u in (2, 4, 8):
            k = mods[(dt, u)][op]
            calls[f"U{u} 1/SM"] = (lambda k=k, cfg=LaunchConfig((rows,), (1024,), one): k.launch(cfg, *args))
        for n, f in calls.items():
            y.zero_(); f(); torch.cuda.synchronize()
            if n != "shipped":
                torch.testing.assert_close(y.float(), want.float(), atol=2e-2, rtol=2e-2, msg=f"{op} {n}")
        per = {n: [] for n in calls}
        for r in range(3):
            names = list(calls)
            for n in names[r:] + names[:r]:
                per[n].append(ops.benchmark(calls[n], runs=50).median_ms * 1e3)
        line = f"{str(dtype)[6:]:8} {rows}x{cols} {op:12}"
        for n, us in per.items():
            med = statistics.median(us)
            out.append({"shape": [rows, cols], "dtype": str(dtype), "op": op, "variant": n, "us": med,
                        "gbps": units * x.nbytes / med / 1e3, "rounds_us": us})
            line += f" | {n} {units * x.nbytes / med / 1e3:5.0f}"
        print(line, flush=True)
for (dt, u), ks in mods.items():
    print(dt, u, {n: (k.attributes.registers, k.attributes.local_bytes) for n, k in ks.items()})
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "l2one.json"), "w"), indent=1)
