#!/usr/bin/env python3
"""transformers' causal-LM loss (``ForCausalLMLoss``: upcast the logits to float32, shift the
labels, torch's cross-entropy) against what ``opsmith.ops.patch`` puts in its place
(``opsmith.ops._patch_loss.CausalLMLoss``: opsmith's cross-entropy on the bf16 logits as they are),
forward + backward, one process, the same inputs; and the same function under
``torch.compile(dynamic=False)``. The function is written out here as transformers 5 has it (no
transformers needed on the GPU machine). Prints ms per call and ours against the best peer.

    python3 bench/bench_causal_lm_loss.py --out DIR      # results.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F


def for_causal_lm_loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None,
                       **kwargs):
    """transformers.loss.loss_utils.ForCausalLMLoss (5.x), its body."""
    logits = logits.float()
    if shift_labels is None:
        labels = F.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:].contiguous()
    logits = logits.view(-1, vocab_size)
    shift_labels = shift_labels.view(-1).to(logits.device)
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = F.cross_entropy(logits, shift_labels, ignore_index=ignore_index, reduction=reduction)
    return loss / num_items_in_batch if reduction == "sum" else loss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default="4x1024x32000,2x4096x32000,1x4096x128256",
                    help="batch x seq x vocab, comma-separated")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from triton.testing import do_bench

    from opsmith.ops._patch_loss import CausalLMLoss
    ours = CausalLMLoss(for_causal_lm_loss)
    rows = []
    for shape in args.shapes.split(","):
        b, t, v = (int(s) for s in shape.split("x"))
        torch.manual_seed(0)
        logits = torch.randn(b, t, v, device="cuda", dtype=torch.bfloat16).requires_grad_()
        labels = torch.randint(0, v, (b, t), device="cuda")
        compiled = torch.compile(for_causal_lm_loss, dynamic=False)
        times = {}
        for name, f in (("eager", for_causal_lm_loss), ("compile", compiled), ("opsmith", ours)):
            def step(f=f, logits=logits, labels=labels, v=v):
                f(logits, labels, v).backward()
                logits.grad = None
            step()
            times[name] = do_bench(step, warmup=5, rep=50)
        best = min(times["eager"], times["compile"])
        rows.append({"shape": shape, "ms": times, "ours_vs_best": best / times["opsmith"]})
        print(f"{shape:<16} fwd+bwd ms: eager {times['eager']:.3f}  compile {times['compile']:.3f}  "
              f"opsmith {times['opsmith']:.3f}   {best / times['opsmith']:.2f}x the best", flush=True)
    meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name(),
            "command": "python3 bench/bench_causal_lm_loss.py " + " ".join(sys.argv[1:])}
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
