"""rotary<T>'s PTX against the kernel before the full tables (5933e66), and ptxas' registers: the
check behind docs/ops.md's "byte-identical" (NVRTC, no GPU). Run from the repository root:
    python3 bench/results/ops-patch-functions-h200-2026-11-26/rotary_ptx_identity.py"""
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, ".")
from opsmith._build._nvrtc import compile_cuda  # noqa: E402
from opsmith.ops import _sources  # noqa: E402

old = Path(tempfile.mkdtemp()) / "rotary.cu"
old.write_text(subprocess.run(["git", "show", "5933e66:opsmith/ops/kernels/rotary.cu"], capture_output=True,
                              text=True, check=True).stdout)


def build(src, names, **kw):
    return compile_cuda(Path(src), arch="sm_90", name_expressions=names, name="rotary.cu",
                        include_paths=[str(_sources.KERNEL_DIR)], **kw)


for t in ("__nv_bfloat16", "__half", "float", "double"):
    a, b = (build(s, [f"rotary<{t}>"], output="ptx").code for s in (old, _sources.KERNEL_DIR / "rotary.cu"))
    a, b = (c.decode() if isinstance(c, bytes) else c for c in (a, b))
    print(t, "PTX identical" if a[a.index(".entry"):] == b[b.index(".entry"):] else "PTX DIFFERS")
log = build(_sources.KERNEL_DIR / "rotary.cu", ["rotary<__nv_bfloat16>", "rotary_full<__nv_bfloat16>"],
            options=["-Xptxas=-v"]).log
print("\n".join(line.strip() for line in log.splitlines() if "registers" in line or "Compiling entry" in line))
