"""PROTOTYPE diag: the register-row forwards with other load/store forms (plain ld.global instead of the
non-coherent path __restrict__ gives, streaming stores) and layer_norm_fwd_c4 at other launch bounds / weight
timing; kernels alone, GB/s, beside Liger."""
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, "bench"); sys.path.insert(0, ".")
from diag_norm_split import per_kernel  # noqa: E402
from opsmith._runtime import _driver  # noqa: E402
from opsmith._runtime._launch_config import LaunchConfig  # noqa: E402
from opsmith._torch._cuda_module import CudaModule  # noqa: E402
from opsmith.ops._sources import KERNEL_DIR  # noqa: E402

from liger_kernel.ops.layer_norm import layer_norm_forward  # noqa: E402
from liger_kernel.ops.rms_norm import rms_norm_forward  # noqa: E402
from liger_kernel.ops.softmax import _softmax_forward  # noqa: E402

tmp = Path(tempfile.mkdtemp())
for f in KERNEL_DIR.iterdir():
    shutil.copy(f, tmp / f.name)
c = (tmp / "common.cuh").read_text()
c = c.replace("                if (j < n && ((on >> s) & 1u)) z = *reinterpret_cast<const Raw*>(src[s] + j);",
              "                if (j < n && ((on >> s) & 1u)) z = ld_var(src[s] + j);")
c = c.replace("        *reinterpret_cast<Raw*>(row + j) = raw_pack<T>(in);  // 16-bit T: two elements an instruction",
              "        st_var(row + j, raw_pack<T>(in));")
helpers = r'''
#ifndef LD_MODE
#define LD_MODE 0
#endif
#ifndef ST_MODE
#define ST_MODE 0
#endif
namespace opsmith {
__device__ __forceinline__ Raw ld_var(const void* p) {
    Raw r;
    if (LD_MODE == 1) asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.u[0]), "=r"(r.u[1]), "=r"(r.u[2]), "=r"(r.u[3]) : "l"(p));
    else if (LD_MODE == 2) asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.u[0]), "=r"(r.u[1]), "=r"(r.u[2]), "=r"(r.u[3]) : "l"(p));
    else if (LD_MODE == 3) asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.u[0]), "=r"(r.u[1]), "=r"(r.u[2]), "=r"(r.u[3]) : "l"(p));
    else r = *reinterpret_cast<const Raw*>(p);
    return r;
}
__device__ __forceinline__ void st_var(void* p, const Raw& r) {
    if (ST_MODE == 1) asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(p), "r"(r.u[0]), "r"(r.u[1]), "r"(r.u[2]), "r"(r.u[3]) : "memory");
    else if (ST_MODE == 2) asm volatile("st.global.L1::no_allocate.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(p), "r"(r.u[0]), "r"(r.u[1]), "r"(r.u[2]), "r"(r.u[3]) : "memory");
    else *reinterpret_cast<Raw*>(p) = r;
}
}  // namespace opsmith
'''
# after the Raw struct
c = c.replace("template <class T, class A> __device__ __forceinline__ Raw raw_pack(const A* in);",
              "template <class T, class A> __device__ __forceinline__ Raw raw_pack(const A* in);\n}  // namespace opsmith\n"
              + helpers + "namespace opsmith {", 1)
(tmp / "common.cuh").write_text(c)
n = (tmp / "norm.cu").read_text()
n = n.replace("""__global__ void __launch_bounds__(OPSMITH_C4_THREADS, (RowBlocks<T, 3, 3>::value))
layer_norm_fwd_c4(""", """#ifndef C4B
#define C4B 3
#endif
#ifndef C4LATE
#define C4LATE 1
#endif
__global__ void __launch_bounds__(OPSMITH_C4_THREADS, C4B)
layer_norm_fwd_c4(""")
n = n.replace("layer_norm_fwd_any<1, T, A, 4>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);",
              "layer_norm_fwd_any<C4LATE, T, A, 4>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);")
n = n.replace("""__global__ void __launch_bounds__(OPSMITH_C4_THREADS, (RowBlocks<T, 3, 3>::value))
rms_norm_fwd_c4(""", """__global__ void __launch_bounds__(OPSMITH_C4_THREADS, C4B)
rms_norm_fwd_c4(""")
(tmp / "norm.cu").write_text(n)
arch = _driver.device_arch(0)
B = "__nv_bfloat16"
VARS = {"base": {}, "ld1": {"LD_MODE": 1}, "ld2": {"LD_MODE": 2}, "ld3": {"LD_MODE": 3}, "st1": {"ST_MODE": 1},
        "st2": {"ST_MODE": 2}, "ld1st1": {"LD_MODE": 1, "ST_MODE": 1},
        "late0": {"C4LATE": 0}, "b4": {"C4B": 4}, "late0b4": {"C4LATE": 0, "C4B": 4}, "b2": {"C4B": 2},
        "late0b2": {"C4LATE": 0, "C4B": 2}}
mods = {}
for name, d in VARS.items():
    mods[name] = (CudaModule(tmp / "norm.cu", name_expressions=[f"layer_norm_fwd_c4<{B}, float>", f"rms_norm_fwd_c4<{B}, float>"],
                             arch=arch, defines=d, name=f"ldst_n_{name}", options=["--ptxas-options=-v"]),
                  CudaModule(tmp / "softmax.cu", name_expressions=[f"softmax_fwd_wide<{B}>", f"softmax_bwd<{B}>"],
                             arch=arch, defines=d, name=f"ldst_s_{name}"))
records = []
for rows, cols in ((4096, 4096), (16384, 4096), (8192, 8192), (2048, 8192), (65536, 1024), (32768, 8192)):
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x); m = torch.empty(rows, device="cuda"); r = torch.empty(rows, device="cuda")
    gb = 2 * x.numel() * 2 / 1e3
    tpr = cols // 8 // 4
    cfg = LaunchConfig((rows,), (tpr, 1), 0)
    rec = {"shape": f"{rows}x{cols}",
           "liger_ln": gb / sum(per_kernel(lambda: layer_norm_forward(x, w, b, 1e-5)).values()),
           "liger_rms": gb / sum(per_kernel(lambda: rms_norm_forward(x, w, 1e-6, 0.0, "llama", None)).values()),
           "liger_sm": gb / sum(per_kernel(lambda: _softmax_forward(x)).values())}
    for name, (nm, sm) in mods.items():
        k = nm.get_kernel(f"layer_norm_fwd_c4<{B}, float>")
        rec[f"ln_{name}"] = gb / sum(per_kernel(lambda: k.launch(cfg, x, w, b, y, m, r, rows, cols, 1e-5, 1, 1)).values())
        if cols <= 8192 and cols * 2 < 16384:
            k = nm.get_kernel(f"rms_norm_fwd_c4<{B}, float>")
            rec[f"rms_{name}"] = gb / sum(per_kernel(lambda: k.launch(cfg, x, w, y, r, rows, cols, 1e-6, 1)).values())
        if not name.startswith(("late", "b")):
            k = sm.get_kernel(f"softmax_fwd_wide<{B}>")
            rec[f"sm_{name}"] = gb / sum(per_kernel(lambda: k.launch(cfg, x, y, rows, cols)).values())
    print(rec["shape"], " ".join(f"{k}:{v:.0f}" for k, v in rec.items() if k != "shape"), flush=True)
    records.append(rec)
for name, (nm, sm) in mods.items():
    log = nm._binaries and next(iter(nm._binaries.values())).log or ""
    print(name, re.findall(r"Used (\d+) registers", log), re.findall(r"(\d+) bytes spill stores", log))
json.dump(records, open(os.path.join(os.environ.get("OUT", "/tmp"), "ldst.json"), "w"), indent=1)
