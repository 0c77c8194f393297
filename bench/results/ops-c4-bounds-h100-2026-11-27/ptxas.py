"""Liger-Kernel's rms_norm forward compiled by Triton's own ptxas and by torch's (torch/bin/ptxas, which Inductor
puts in TRITON_PTXAS_PATH once it compiles), each in a fresh process with its own Triton cache: GB/s, L2 flushed,
ours beside; the cubins' sass under $OUT/ptxas_*. Run from the repository root."""
import collections, glob, os, shutil, subprocess, sys
mode = sys.argv[1] if len(sys.argv) > 1 else None
out = os.environ.get("OUT", "/tmp")
if mode is None:
    import torch
    tp = os.path.join(os.path.dirname(torch.__file__), "bin", "ptxas")
    print("torch ptxas:", tp, os.path.exists(tp))
    for m in ("triton", "torch"):
        env = dict(os.environ, TRITON_CACHE_DIR=f"/tmp/tc_{m}")
        shutil.rmtree(env["TRITON_CACHE_DIR"], ignore_errors=True)
        if m == "torch":
            env["TRITON_PTXAS_PATH"] = tp
        else:
            env.pop("TRITON_PTXAS_PATH", None)
        print(subprocess.run([sys.executable, __file__, m], env=env, capture_output=True, text=True).stdout, flush=True)
        d = f"{out}/ptxas_{m}"
        os.makedirs(d, exist_ok=True)
        for f in glob.glob(f"/tmp/tc_{m}/**/*rms_norm_forward*", recursive=True):
            shutil.copy(f, d)
        for f in glob.glob(f"{d}/*.cubin"):
            sass = subprocess.run(["/usr/local/cuda/bin/cuobjdump", "-sass", f], capture_output=True, text=True).stdout
            open(f + ".sass", "w").write(sass)
            ins = [ln.split("*/")[1].strip().split(" ")[0] for ln in sass.splitlines()
                   if ln.strip().startswith("/*") and "*/" in ln]
            c = collections.Counter(i.rstrip(";") for i in ins if i)
            print(m, os.path.basename(f), len(ins), "instructions;",
                  sorted((k, v) for k, v in c.items() if k.startswith(("LDG", "STG", "LD", "ST", "BAR", "SHFL"))))
    sys.exit(0)
import torch  # noqa: E402
sys.path.insert(0, "bench")
from opsmith import ops  # noqa: E402
from liger_kernel.ops.rms_norm import rms_norm_forward  # noqa: E402
for rows, cols in ((2048, 2048), (4096, 4096), (16384, 4096), (4096, 8192)):
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    f = lambda: rms_norm_forward(x, w, 1e-6, 0.0, "llama", None)  # noqa: E731
    g = lambda: ops.rms_norm(x, (cols,), w, 1e-6)  # noqa: E731
    f()
    print(mode, rows, cols, "liger", round(ops.benchmark(f, bytes_moved=2 * x.nbytes, runs=300).gbps),
          "ours", round(ops.benchmark(g, bytes_moved=2 * x.nbytes, runs=300).gbps))
