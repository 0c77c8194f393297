"""torch.compile(dynamic=False)'s rms_norm forward at float32 2048x32768: its Triton kernel's source and launch."""
import torch
x = torch.randn(2048, 32768, device="cuda"); w = torch.randn(32768, device="cuda")
f = torch.compile(lambda x, w: torch.nn.functional.rms_norm(x, [32768], w, 1e-6), dynamic=False)
f(x, w); torch.cuda.synchronize()
from triton.testing import do_bench
print("compile rms fwd us", do_bench(lambda: f(x, w)) * 1e3)
