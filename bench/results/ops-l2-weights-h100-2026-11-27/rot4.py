"""rotary_qk's block order, q and k as bench_ops_peers allocates them (each its own tensor): shipped (even blocks q,
odd k), halves (the first half of the grid q, the second k), and pairs (blocks 2i and 2i+1 of q, then 2i and 2i+1 of
k: 4-block groups); compile beside. fwd, opsmith.ops.benchmark median of 40 (L2 flushed), 3 rounds."""
import statistics, sys, types, torch
sys.path.insert(0, "bench")
import bench_ops_peers as bp
from opsmith import ops
from opsmith._runtime import _driver
from opsmith._torch._cuda_module import CudaModule
from opsmith.ops import _rotary, _sources

torch._dynamo.config.recompile_limit = 64
SRC = (_sources.KERNEL_DIR / "rotary.cu").read_text()
A = "const bool second = blockIdx.x & 1u;"
assert A in SRC and ": p3, blockIdx.x >> 1, gridDim.x >> 1)" in SRC
VAR = {"halves": SRC.replace(A, "const bool second = blockIdx.x >= (gridDim.x >> 1);").replace(
           ": p3, blockIdx.x >> 1, gridDim.x >> 1)", ": p3, second ? blockIdx.x - (gridDim.x >> 1) : blockIdx.x, gridDim.x >> 1)"),
       "quads": SRC.replace(A, "const bool second = blockIdx.x & 2u;").replace(
           ": p3, blockIdx.x >> 1, gridDim.x >> 1)", ": p3, ((blockIdx.x >> 2) << 1) | (blockIdx.x & 1u), gridDim.x >> 1)")}
TN = {torch.float32: "float", torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}
arch = _driver.device_arch(0)
mods = {n: CudaModule(s, name_expressions=[f"rotary_qk<{t}>" for t in TN.values()], arch=arch, name=f"probe/rot4_{n}.cu",
                      include_paths=[str(_sources.KERNEL_DIR)]) for n, s in VAR.items()}
orig = _rotary._sources


def variant(m):
    def f(q, k, c, s):
        _rotary._sources = types.SimpleNamespace(kernel=lambda fl, n, dt, dev: m.get_kernel(n.format(T=TN[q.dtype])))
        try:
            return _rotary.rotary_qk_cuda(q, k, c, s)
        finally:
            _rotary._sources = orig
    return f


im = bp.impls("rotary", None)
for dt, (r, c) in ((torch.float32, (2048, 2048)), (torch.float32, (4096, 4096)), (torch.float32, (8192, 8192)),
                   (torch.float16, (16384, 4096)), (torch.float16, (2048, 2048)), (torch.bfloat16, (4096, 16384))):
    torch.manual_seed(0)
    q, k, cs, sn = im["opsmith"][0](r, c, dt, "cuda", False)
    comp = torch.compile(im["eager"][1], dynamic=False)
    calls = {"ship": lambda: _rotary.rotary_qk_cuda(q, k, cs, sn), "compile": lambda: comp(q, k, cs, sn)}
    for n, m in mods.items():
        calls[n] = lambda f=variant(m): f(q, k, cs, sn)
    want = _rotary.rotary_qk_cuda(q, k, cs, sn)
    for n, f in calls.items():
        with torch.no_grad():
            got = f()
        torch.testing.assert_close(got[0], want[0]); torch.testing.assert_close(got[1], want[1])
    per = {n: [] for n in calls}
    with torch.no_grad():
        for rnd in range(3):
            nm = list(calls)
            for n in nm[rnd:] + nm[:rnd]:
                per[n].append(ops.benchmark(calls[n], runs=40).median_ms * 1e3)
    base = statistics.median(per["compile"])
    print(str(dt)[6:], f"{r}x{c}", " | ".join(f"{n} {statistics.median(v):7.2f}us {base / statistics.median(v):.3f}"
                                         for n, v in per.items()), flush=True)
