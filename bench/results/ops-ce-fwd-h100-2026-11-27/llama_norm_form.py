"""compile vs compile+patch (RMSNorm's inductor path: torch.rms_norm, as shipped) vs compile+patch with the
inductor path written as transformers' LlamaRMSNorm (float upcast, pow/mean/rsqrt, cast, times weight)."""
import statistics, sys, types, json
import torch
sys.path.insert(0, "bench")
import bench_llama_step as b
import opsmith.ops
from opsmith.ops import _modules

def hf_form(self, x):
    if self.inductor and _modules.compiling():
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)
    return opsmith.ops.rms_norm(x, self.normalized_shape, self.weight, self.eps)

cfg = dict(vocab=32000, hidden=2048, inter=5632, heads=16, layers=4, seq=1024)
torch.manual_seed(0)
tokens = torch.randint(0, cfg["vocab"], (4, cfg["seq"]), device="cuda"); labels = tokens
variants = {}
for name in ("compile", "compile+patch", "compile+patch hf-form"):
    torch.manual_seed(0)
    m = b.build("hf", cfg).to(device="cuda", dtype=torch.bfloat16)
    fns = []
    if name != "compile":
        done = opsmith.ops.patch(m)
        fns = [r.new for r in done if isinstance(r.new, b.RotaryPosEmb)]
        for f in fns: f.restore()
        if "hf" in name:
            for r in done:
                if type(r.new) is _modules.RMSNorm:
                    r.new.forward = types.MethodType(hf_form, r.new)
    variants[name] = b.Variant(torch.compile(b.HFStep(m)), fns, "cuda")
names = list(variants)
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
for r in range(rounds):
    for name in names[r % 3:] + names[:r % 3]:
        v = variants[name]; v.activate(True); v.timed(tokens, labels, 10, 5 if r == 0 else 2); v.activate(False)
res = {}
for name, v in variants.items():
    med = statistics.median(v.times)
    print(f"{name:<24} {med:7.2f} ms (min {min(v.times):.2f}); per round", [round(statistics.median(v.times[i*10:(i+1)*10]), 2) for i in range(rounds)], flush=True)
    v.activate(True); prof = b.kernel_profile(v, tokens, labels); v.activate(False)
    res[name] = {"median_ms": med, "times": v.times, "profile": prof}
    print(f"   kernels {sum(prof['kernels'].values())/1e3:.2f} ms, idle {prof['idle_us']/1e3:.2f} ms")
    for k, t in list(prof["kernels"].items())[:25]:
        print(f"   {t:8.1f} us {k[:90]}")
json.dump(res, open(sys.argv[1], "w"), indent=1)
