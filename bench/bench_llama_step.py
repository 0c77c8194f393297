#!/usr/bin/env python3
"""Issue 23's model figure: a training step of a 4-layer Llama-style model, eager and under
torch.compile, with and without ``opsmith.ops.patch``, all four in one process. Patched, the
RMSNorms run opsmith's rms_norm, the rotary embedding opsmith's rotary_embedding, each SwiGLU MLP
becomes a ``GatedMLP``:
``down(silu_mul(gate(x), up(x)))``, the SiLU and the multiply one kernel that reads the two
projections' outputs and writes one tensor (forward), and one that writes both gradients
(backward), and the ``nn.CrossEntropyLoss`` runs opsmith's cross_entropy (one read of the
logits forward, one read and one write backward).

Two models, ``--model``: ``hf`` (the default) is transformers' own ``LlamaForCausalLM`` of that
size (``LlamaConfig``, SDPA attention, random weights; transformers must be importable: on the GPU
machine carry its wheels, ``bench/README.md``), where ``patch`` finds transformers' class names
(``LlamaRMSNorm``, ``LlamaMLP``), its ``apply_rotary_pos_emb`` and its ``loss_function``
(``ForCausalLMLoss``, whose float32 copy of the logits the replacement avoids). ``plain`` is a
model written out here (no transformers needed): token embedding,
per layer RMSNorm -> causal attention (q/k/v/o projections, rotary embedding, SDPA) ->
residual, RMSNorm -> SwiGLU MLP (down(silu(gate(x)) * up(x)), the SiLU an ``nn.SiLU`` module as
in transformers' Llama) -> residual; final RMSNorm, LM head, cross-entropy on the float logits
(an ``nn.CrossEntropyLoss`` module). The rotary embedding is a function, as in transformers
(``apply_rotary_pos_emb(q, k, cos, sin)`` of the attention class's Python module): patch replaces
it with opsmith's rotary_embedding (``--no-rotary``: it stays torch's). Random weights,
bf16, hidden 2048, intermediate 5632, 16 heads, vocab 32000, batch 4 x 1024 tokens by default.
A step is forward + loss + backward + AdamW (fused) + zero_grad. The four variants are built
first, then timed in ``--rounds`` rounds, each variant in turn (the order rotating from round to
round), ``--steps`` CUDA-event-timed steps a round after a warm-up (``--warmup`` in the first
round, which compiles; 2 after): each figure is the median of its ``rounds * steps`` steps, and a
drift of the machine during the run falls on all four alike.

    python3 bench/bench_llama_step.py --out DIR            # results.json; prints the four step times
    python3 bench/bench_llama_step.py --out DIR --tiny --device cpu   # the plumbing, on CPU
"""
from __future__ import annotations

import argparse
import collections
import functools
import json
import statistics
import sys
import time
from pathlib import Path

# before torch: `import torch` loads the opsmith_compile_cache backend entry point of an installed
# opsmith, which fails where opsmith is importable only from this checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
from torch import nn

import opsmith.ops
from opsmith.ops._patch_rotary import RotaryPosEmb


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' Llama rotary embedding, its signature and body (cos/sin [batch, seq, head_dim])."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.dim = heads, hidden // heads
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden, bias=False) for _ in range(4))

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, self.heads, self.dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate, self.up = nn.Linear(hidden, inter, bias=False), nn.Linear(hidden, inter, bias=False)
        self.down, self.act = nn.Linear(inter, hidden, bias=False), nn.SiLU()

    def forward(self, x):
        return self.down(self.act(self.gate(x)) * self.up(x))


class Layer(nn.Module):
    def __init__(self, hidden: int, inter: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(hidden, eps=1e-6), nn.RMSNorm(hidden, eps=1e-6)
        self.attn, self.mlp = Attention(hidden, heads), MLP(hidden, inter)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


class Llama(nn.Module):
    def __init__(self, vocab: int, hidden: int, inter: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(Layer(hidden, inter, heads) for _ in range(layers))
        self.norm, self.head = nn.RMSNorm(hidden, eps=1e-6), nn.Linear(hidden, vocab, bias=False)
        self.loss = nn.CrossEntropyLoss()  # a module, as in many training loops: patch replaces it
        dim = hidden // heads
        inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
        freqs = torch.outer(torch.arange(seq).float(), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, tokens, labels):
        x = self.embed(tokens)
        cos, sin = self.cos[None].to(x.dtype), self.sin[None].to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.head(self.norm(x))
        return self.loss(logits.float().view(-1, logits.shape[-1]), labels.view(-1))


class HFStep(nn.Module):
    """transformers' ``LlamaForCausalLM`` called as the plain model is: ``(tokens, labels) -> loss``
    (transformers shifts the labels itself: they are the tokens)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens, labels):
        return self.model(input_ids=tokens, labels=tokens, use_cache=False).loss


def build(kind: str, cfg: dict) -> nn.Module:
    if kind == "plain":
        return Llama(**cfg)
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as exc:
        raise SystemExit(f"--model hf needs transformers ({exc}); install it (on the GPU machine from carried "
                         "wheels: bench/README.md) or pass --model plain") from None
    config = LlamaConfig(vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], intermediate_size=cfg["inter"],
                         num_attention_heads=cfg["heads"], num_key_value_heads=cfg["heads"],
                         num_hidden_layers=cfg["layers"], max_position_embeddings=cfg["seq"], rms_norm_eps=1e-6,
                         use_cache=False, tie_word_embeddings=False, attn_implementation="sdpa")
    return LlamaForCausalLM(config)


class Variant:
    """One of the four: its model (compiled or not), its optimiser (fused AdamW) and the
    process-wide functions patch installed for it (the rotary embedding), put in place by
    ``activate`` before each of its rounds and taken out after."""

    def __init__(self, run, functions: list, device: str) -> None:
        self.run, self.functions, self.device = run, functions, device
        self.opt = torch.optim.AdamW(run.parameters(), lr=1e-4, fused=device != "cpu")
        self.times: list[float] = []

    def step(self, tokens, labels) -> None:
        self.run(tokens, labels).backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def activate(self, on: bool) -> None:
        for f in self.functions:
            f.install() if on else f.restore()

    def timed(self, tokens, labels, steps: int, warmup: int) -> None:
        """``warmup`` steps, then ``steps`` timed ones (CUDA events; wall clock on CPU) added to times."""
        for _ in range(warmup):
            self.step(tokens, labels)
        for _ in range(steps):
            if self.device == "cpu":
                t = time.perf_counter()
                self.step(tokens, labels)
                self.times.append((time.perf_counter() - t) * 1e3)
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.step(tokens, labels)
            end.record()
            end.synchronize()
            self.times.append(start.elapsed_time(end))


def kernel_profile(v: Variant, tokens, labels, steps: int = 3) -> dict:
    """Per step, after warm-up (torch.profiler): ``kernels``, microseconds of CUDA kernel time by
    kernel name; ``idle_us``, the time the GPU ran no kernel between the first kernel and the last;
    ``gaps``, the 12 longest such gaps with the kernels on either side (where the GPU waited on
    the host)."""
    from torch.profiler import ProfilerActivity, profile
    step = functools.partial(v.step, tokens, labels)
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    per: dict[str, float] = collections.defaultdict(float)
    spans = []
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name[:100]] += getattr(e, "device_time", 0) / steps
            spans.append((e.time_range.start, e.time_range.end, e.name[:60]))
    spans.sort()
    idle, gaps, end, last = 0.0, [], None, ""
    for start, stop, name in spans:
        if end is not None and start > end:
            idle += start - end
            gaps.append((round(start - end, 1), last, name))
        if end is None or stop > end:
            end, last = stop, name
    gaps.sort(reverse=True)
    return {"kernels": dict(sorted(per.items(), key=lambda kv: -kv[1])), "idle_us": idle / steps,
            "gaps": gaps[:12]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=10, help="timed steps a round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the four variants in turn")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--tiny", action="store_true", help="a tiny model (a smoke test)")
    ap.add_argument("--profile", action="store_true", help="also each variant's CUDA kernels per step (profile.json)")
    ap.add_argument("--model", choices=("hf", "plain"), default="hf",
                    help="transformers' LlamaForCausalLM (default) or the model written out here")
    ap.add_argument("--no-rotary", action="store_true", help="patch(model, rotary=False): the rotary stays torch's")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = dict(vocab=32000, hidden=2048, inter=5632, heads=16, layers=4, seq=1024)
    batch = 4
    if args.tiny:
        cfg, batch = dict(vocab=512, hidden=128, inter=352, heads=4, layers=2, seq=64), 2
    dtype = torch.bfloat16 if args.device != "cpu" else torch.float32
    torch.manual_seed(0)
    tokens = torch.randint(0, cfg["vocab"], (batch, cfg["seq"]), device=args.device)
    labels = torch.roll(tokens, -1, dims=1)
    replaced, kinds, profiles, variants = None, collections.Counter(), {}, {}
    for patched in (False, True):
        for compiled in (False, True):
            torch.manual_seed(0)
            model = build(args.model, cfg).to(device=args.device, dtype=dtype)
            functions = []
            if patched:
                skipped = []
                done = opsmith.ops.patch(model, rotary=not args.no_rotary, skipped=skipped)
                for n, _, why in skipped:
                    print(f"    patch left {n}: {why}", flush=True)
                replaced = [str(r) for r in done]
                kinds = collections.Counter(f"{type(r.old).__name__} -> {type(r.new).__name__}" for r in done)
                # process-wide (the rotary embedding): in place only while this variant runs
                functions = [r.new for r in done if isinstance(r.new, RotaryPosEmb)]
                for f in functions:
                    f.restore()
            if args.model == "hf":
                model = HFStep(model)
            name = ("compile" if compiled else "eager") + (" + opsmith.ops.patch" if patched else "")
            variants[name] = Variant(torch.compile(model) if compiled else model, functions, args.device)
    # rounds: each variant in turn, the order rotating, so that a drift of the machine (clocks,
    # the host) falls on all four alike; the first round's warm-up compiles
    names = list(variants)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            v = variants[name]
            v.activate(True)
            v.timed(tokens, labels, args.steps, args.warmup if r == 0 else 2)
            v.activate(False)
    results = {name: statistics.median(v.times) for name, v in variants.items()}
    for name, v in variants.items():
        print(f"{name:<32} {results[name]:8.2f} ms / step (median of {len(v.times)}; "
              f"{min(v.times):.2f} - {max(v.times):.2f})", flush=True)
        if args.profile and args.device != "cpu":
            v.activate(True)
            profiles[name] = prof = kernel_profile(v, tokens, labels)
            v.activate(False)
            total = sum(prof["kernels"].values())
            print(f"    kernels {total / 1e3:.2f} ms / step, GPU idle {prof['idle_us'] / 1e3:.2f} ms; the top 12:",
                  flush=True)
            for k, t in list(prof["kernels"].items())[:12]:
                print(f"    {t:8.1f} us  {k}", flush=True)
            for gap, before, after in prof["gaps"][:5]:
                print(f"    idle {gap:7.1f} us  after {before[:40]} before {after[:40]}", flush=True)
    eager, compiled = results["eager"], results["compile"]
    summary = {"patched_eager_speedup": eager / results["eager + opsmith.ops.patch"],
               "patched_compile_vs_compile": compiled / results["compile + opsmith.ops.patch"]}
    meta = {"model": args.model, "config": cfg, "batch": batch, "dtype": str(dtype), "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if args.device != "cpu" else "cpu",
            "command": "python3 bench/bench_llama_step.py " + " ".join(sys.argv[1:])}
    if profiles:
        (args.out / "profile.json").write_text(json.dumps(profiles, indent=1))
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "ms_per_step": results, "summary": summary,
                                                       "step_ms": {n: v.times for n, v in variants.items()},
                                                       "replaced": replaced}, indent=1))
    print(f"patched eager: {summary['patched_eager_speedup']:.2f}x eager (target >= 1.3); patched compile: "
          f"{summary['patched_compile_vs_compile']:.2f}x compile (target >= 1.0); {len(replaced or [])} "
          f"replaced ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
