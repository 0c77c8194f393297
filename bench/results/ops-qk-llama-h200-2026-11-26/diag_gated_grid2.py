import sys, torch, json
sys.path.insert(0, ".")
from opsmith.ops import _functional as fn, _launch
from torch.profiler import profile, ProfilerActivity
orig = _launch.gated_plan
props = _launch.device_props(0)
def kernels_us(f, n=20):
    for _ in range(2): f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(n): f()
        torch.cuda.synchronize()
    ev = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.device_time for e in ev) / n
res = []
for op in sys.argv[2].split(","):
  for rows in (512, 1024, 2048, 4096, 8192):
    for d in (1024, 2048, 4096, 5632, 8192):
      if rows * d > 8192 * 8192: continue
      x = torch.randn(rows, 2 * d, device="cuda", dtype=torch.bfloat16)
      g = torch.randn(rows, d, device="cuda", dtype=torch.bfloat16)
      base = orig(rows, d, 2, props)
      gx, gy = base.grid
      tx, ty = base.block
      row = {"op": op, "rows": rows, "d": d, "gx": gx, "plan_gy": gy, "t": {}}
      for m in (1, 2, 4, 8, 16):
        y = max(1, -(-rows // (m * ty)))
        plan = _launch.Plan("gated", (gx, min(y, 65535)), base.block, 0, 0)
        _launch.gated_plan = lambda *a, plan=plan: plan
        f = kernels_us(lambda: fn.gated_fwd(op, x))
        b = kernels_us(lambda: fn.gated_bwd(op, g, x))
        row["t"][y] = (round(f, 2), round(b, 2))
      _launch.gated_plan = orig
      res.append(row)
      t = row["t"]
      bf = min(t, key=lambda k: t[k][0]); bb = min(t, key=lambda k: t[k][1])
      pg = -(-rows // (2 * ty))  # the plan is max(rows/2ty, wave/gx)
      print(f"{op} {rows}x{d} gx{gx} plan gy{gy}: " + " ".join(f"{k}:{v[0]}/{v[1]}" for k, v in t.items())
            + f" | best fwd gy{bf} bwd gy{bb} blocks {gx*bb}", flush=True)
json.dump(res, open(sys.argv[1], "w"))
