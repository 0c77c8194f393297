"""norm_l2.cu's second passes with x's, w's and b's loads issued together (this tree) against HEAD's (w and b loaded
per chunk after the math of the one before), at every L2 row kind: B = 1 (rows past 80 KiB) and B = 2; layer_norm's
pass-2 chunks a trip P (OPSMITH_L2_LN_PASS2[_ONE]); B = 1 also without the shared-memory padding (nopad) and rms_norm
at 8 chunks a trip (U8). Kernels alone, opsmith.ops.benchmark median (L2 flushed), 3 rounds; copy and compile beside."""
import json, os, statistics, subprocess, torch
import torch.nn.functional as F
from opsmith import ops
from opsmith._runtime import _driver
from opsmith._torch._cuda_module import CudaModule
from opsmith._runtime._launch_config import LaunchConfig
from opsmith.ops import _sources, _launch, _launch_norm

NEW = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "norm_l2_ln3.cu")).read()  # the probe's tree
OLD = subprocess.run(["git", "show", "e69315d:opsmith/ops/kernels/norm_l2.cu"], capture_output=True, text=True, check=True).stdout
arch = _driver.device_arch(0)
TN = {torch.float32: "float", torch.bfloat16: "__nv_bfloat16"}
names = [f"{op}_fwd_l2<{b}, {t}, float>" for op in ("layer_norm", "rms_norm", "add_rms_norm") for b in (1, 2)
         for t in TN.values()]
mods = {}
for tag, src, defs in (("old", OLD, {}), ("P1", NEW, {"OPSMITH_L2_LN_PASS2_ONE": 1, "OPSMITH_L2_LN_PASS2": 1}),
                       ("P2", NEW, {"OPSMITH_L2_LN_PASS2_ONE": 2, "OPSMITH_L2_LN_PASS2": 2}),
                       ("P4", NEW, {"OPSMITH_L2_LN_PASS2_ONE": 4, "OPSMITH_L2_LN_PASS2": 2}),
                       ("U8", NEW.replace("#define OPSMITH_L2_UNROLL_ONE 4", "#define OPSMITH_L2_UNROLL_ONE 8"), {})):
    mods[tag] = CudaModule(src, name_expressions=names, arch=arch, name=f"probe/ln3_{tag}.cu", defines=defs,
                           include_paths=[str(_sources.KERNEL_DIR)])
    print(tag, {n: (mods[tag].get_kernel(n).attributes.registers, mods[tag].get_kernel(n).attributes.local_bytes)
                for n in names if "float>" in n and "<1" in n})
props = _launch.device_props(0)
out = []
for dt, rows, cols in ((torch.float32, 2048, 32768), (torch.float32, 4096, 32768), (torch.float32, 4096, 24576),
                       (torch.float32, 4096, 20480), (torch.float32, 4096, 16384), (torch.bfloat16, 2048, 32768),
                       (torch.bfloat16, 2048, 65536), (torch.bfloat16, 4096, 8192)):
    x = torch.randn(rows, cols, device="cuda", dtype=dt) * 3 + 1; res = torch.randn_like(x)
    w, b = torch.randn(cols, device="cuda", dtype=dt), torch.randn(cols, device="cuda", dtype=dt)
    y, s = torch.empty_like(x), torch.empty_like(x)
    mean, rstd = torch.empty(rows, device="cuda"), torch.empty(rows, device="cuda")
    plan = _launch_norm.norm_l2_plan(rows, cols, x.element_size(), props)
    B = 1 if plan.shared_mem else 2
    pad, nopad = LaunchConfig(plan.grid, plan.block, plan.shared_mem), LaunchConfig(plan.grid, plan.block, 0)
    z = torch.empty_like(x)
    comp = {"layer_norm": torch.compile(lambda x, w, b: F.layer_norm(x, (cols,), w, b, 1e-5), dynamic=False),
            "rms_norm": torch.compile(lambda x, w: F.rms_norm(x, (cols,), w, 1e-6), dynamic=False)}
    for op in ("layer_norm", "rms_norm", "add_rms_norm"):
        units = 4 if op == "add_rms_norm" else 2
        if op == "layer_norm":
            want = F.layer_norm(x.double(), (cols,), w.double(), b.double(), 1e-5)
            args = (x, w, b, y, mean, rstd, rows, cols, 1e-5, 1, 1)
            tags = ["old", "P1", "P2", "P4"]
        elif op == "rms_norm":
            want = F.rms_norm(x.double(), (cols,), w.double(), 1e-6)
            args = (x, w, y, rstd, rows, cols, 1e-6, 1)
            tags = ["old", "P1"] + (["U8"] if B == 1 else [])
        else:
            want = F.rms_norm((x + res).to(dt).double(), (cols,), w.double(), 1e-6)
            args = (x, res, w, y, s, rstd, rows, cols, 1e-6, 1)
            tags = ["old", "P1"]
        name = f"{op}_fwd_l2<{B}, {TN[dt]}, float>"
        calls = {"copy": lambda: z.copy_(x)}
        if op in comp:
            calls["compile"] = (lambda f=comp[op], a=((x, w, b) if op == "layer_norm" else (x, w)): f(*a))
        for tag in tags:
            k = mods[tag].get_kernel(name)
            tg = tag if tag != "P1" or op == "layer_norm" else "new"
            calls[tg] = lambda k=k, a=args: k.launch(pad, *a)
            if B == 1:
                calls[tg + "-nopad"] = lambda k=k, a=args: k.launch(nopad, *a)
        for n, fn in calls.items():
            y.zero_(); fn(); torch.cuda.synchronize()
            if n not in ("compile", "copy"):
                tol = 1e-4 if dt == torch.float32 else 2e-2
                torch.testing.assert_close(y.double(), want, atol=tol, rtol=tol, msg=f"{op} {n}")
        per = {n: [] for n in calls}
        for r in range(3):
            nm = list(calls)
            for n in nm[r:] + nm[:r]:
                per[n].append(ops.benchmark(calls[n], runs=40).median_ms * 1e3)
        cp = statistics.median(per["copy"])
        line = f"{op:12} {str(dt)[6:]:8} {rows}x{cols} B{B}"
        for n, us in per.items():
            med = statistics.median(us)
            gb = (units if n != "copy" else 2) * x.nbytes / med / 1e3
            out.append({"op": op, "dtype": str(dt), "shape": [rows, cols], "B": B, "variant": n, "us": med, "gbps": gb,
                        "rounds_us": us})
            line += f" | {n} {gb:4.0f}" + (f" ({2 * x.nbytes / cp / 1e3 and gb / (2 * x.nbytes / cp / 1e3):4.2f})" if n != "copy" else "")
        print(line, flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "ln3.json"), "w"), indent=1)
