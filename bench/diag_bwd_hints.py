#!/usr/bin/env python3
"""Cache hints on the gated backwards' loads, for the fwd+bwd cases where Liger-Kernel's gated backward (which
writes its gradients over its inputs, so its working set stays in L2) still leads: silu_and_mul 2048x2048 0.97x,
512x1024 0.89-0.90x (bench/results/ops-c8-h100-2026-11-27/peers-table.txt;
this script's run: bench/results/ops-hints-h100-2026-11-27/). Every input of a gated backward is read
there for the last time in an MLP (grad_y always; gate and up where the activation is saved for this backward
alone), so those lines may go first when L2 needs room, before the lines the backward has yet to read.

gated.cu compiled with OPSMITH_BWD_LAST_USE=0 (plain loads, as before), 1 (grad_y read evict-first:
ld.global.cs; shipped since) and 2 (gate and up too), bf16, silu_and_mul and gelu_and_mul's tanh form, through opsmith.ops'
Python implementations (bench/diag_bwd_order.py's cases): the forward and backward kernels together after an L2
flush ("pair"), the backward alone after a flush ("bwd"), and Liger's autograd forward + backward, GB/s of the
bytes-moved floor (opsmith.ops.benchmark, median of 100). Each variant's result is checked against the plain one.
Needs a GPU; Liger is optional (PYTHONPATH to its wheel's files).

    python3 bench/diag_bwd_hints.py [--json FILE]
"""
import argparse
import sys

import torch

sys.path.insert(0, ".")
import diag_bwd_order  # noqa: E402  (bench/, this script's folder)
from _kernel_timing import write_records  # noqa: E402
from opsmith import ops  # noqa: E402
from opsmith._runtime import _driver  # noqa: E402
from opsmith._torch._cuda_module import CudaModule  # noqa: E402
from opsmith.ops import _sources  # noqa: E402

VARIANTS = (0, 1, 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    diag_bwd_order.GATED = [(512, 1024), (2048, 2048), (4096, 4096), (8192, 8192)]
    key = ("gated.cu", "bfloat16", 0)
    mods = {v: CudaModule(_sources.KERNEL_DIR / "gated.cu", name_expressions=_sources.kernel_names(*key[:2]),
                          arch=_driver.device_arch(0), defines={"OPSMITH_BWD_LAST_USE": v},
                          name=f"diag/gated.cu:last_use={v}") for v in VARIANTS}
    records = []
    for op, rows, cols, file, fwd, bwd, fwd_bytes, pair_bytes, x, liger in diag_bwd_order._cases():
        if file != "gated":
            continue
        with torch.no_grad():
            y0 = fwd()
        shipped = _sources._modules.get(key)
        rec = {"op": op, "rows": rows, "cols": cols}
        with torch.no_grad():
            for v in VARIANTS:
                _sources._modules[key] = mods[v]
                if v == 0:
                    dx0 = bwd(y0).clone()
                torch.testing.assert_close(bwd(y0), dx0, rtol=0, atol=0)
                rec[f"pair_{v}"] = ops.benchmark(lambda: bwd(fwd()), bytes_moved=pair_bytes).gbps
                rec[f"bwd_{v}"] = ops.benchmark(lambda: bwd(y0), bytes_moved=pair_bytes - fwd_bytes).gbps
            if shipped is None:
                _sources._modules.pop(key)
            else:
                _sources._modules[key] = shipped
        if liger is not None:
            rec["pair_liger"] = ops.benchmark(liger, bytes_moved=pair_bytes).gbps
        records.append(rec)
        pairs = " ".join(f"{v}:{rec[f'pair_{v}']:5.0f}" for v in VARIANTS)
        bwds = " ".join(f"{v}:{rec[f'bwd_{v}']:5.0f}" for v in VARIANTS)
        print(f"{op:<13} {rows:>5}x{cols:<5} fwd+bwd GB/s {pairs} liger {rec.get('pair_liger', 0):5.0f} | "
              f"bwd alone {bwds}", flush=True)
    write_records(args.json, records)


if __name__ == "__main__":
    main()
