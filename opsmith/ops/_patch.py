"""``opsmith.ops.patch(model)``: opsmith's ops in an existing model, one line.

It walks a ``torch.nn.Module`` tree and replaces, in place, the modules it recognises:

- SwiGLU/GeGLU MLPs, ``down(act(gate(x)) * up(x))``: a module whose children are projections
  named ``gate_proj``/``up_proj``/``down_proj`` (Hugging Face ``transformers``' Llama, Mistral,
  Qwen2/3, Gemma 1/2/3 MLPs, known by class name too) or ``gate``/``up``/``down``, and an
  activation (``act_fn``, ``act`` or ``activation_fn``: SiLU, or GELU exact or tanh as Gemma's),
  and nothing else; or ``gate_up_proj``/``down_proj`` (Phi-3: one packed projection). The
  replacement, a :class:`GatedMLP`, computes ``down(silu_mul(gate(x), up(x)))`` (``gelu_mul``;
  ``silu_and_mul`` for the packed form): the activation and the multiply are one kernel (the
  replaced MLP's activation module is not replaced again on its own);
- norms: ``torch.nn.LayerNorm`` and ``torch.nn.RMSNorm``; the RMS norms of Hugging Face
  ``transformers`` by class name (Llama, Mistral, Mixtral, Qwen2/3 (and MoE), Phi-3: ``x *
  rsqrt(mean(x²) + eps) * weight``; Gemma, Gemma 2 and 3: ``... * (1 + weight)``), and any other
  module named ``*RMSNorm`` with a 1-d ``weight`` and an ``eps``/``variance_epsilon`` whose
  output matches one of those two forms;
- activations: ``torch.nn.ReLU``, ``SiLU`` and ``GELU``, and ``transformers``' ``SiLUActivation``,
  ``GELUActivation`` and ``GELUTanh``/``PytorchGELUTanh`` (the SwiGLU/GeGLU MLPs' ``act_fn``);
- losses: ``torch.nn.CrossEntropyLoss`` without class weights: a :class:`CrossEntropyLoss` that
  runs opsmith's fused cross-entropy on ``[N, V]`` logits with class-index targets and hands
  every other input (``[N, C, d...]`` logits, probability targets) to torch's, so it stands in
  for the original on any input; and transformers' causal-LM loss function,
  ``model.loss_function`` (:mod:`opsmith.ops._patch_loss`: no float32 copy of the logits);
- the rotary embedding: the ``apply_rotary_pos_emb(q, k, cos, sin)`` function of the Python
  module of an ``*Attention`` module (transformers' convention), replaced in that Python module
  for the whole process (:mod:`opsmith.ops._patch_rotary`; ``restore()`` undoes it).

The new modules hold the old ones' parameters (the same ``Parameter`` objects: state dicts,
optimisers and tied weights are untouched; a GatedMLP holds the MLP's projection modules
themselves, under their own names) and their train/eval mode. Before a replacement stays, both
modules run on a small random input of the parameters' dtype and device and must agree within
that dtype's tolerance (``check=False`` skips it for modules known by type or class name); a
module that does not, or whose own forward fails on that input, is left alone and reported.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch

from opsmith._errors import SpecError
from opsmith.ops import _modules, _patch_loss, _patch_rotary

__all__ = ["CrossEntropyLoss", "GatedMLP", "Replaced", "patch"]

_RMS = {"LlamaRMSNorm", "MistralRMSNorm", "MixtralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm",
        "Qwen2MoeRMSNorm", "Qwen3MoeRMSNorm", "Phi3RMSNorm"}
_RMS_OFFSET = {"GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm"}
_SILU = {"SiLU", "SiLUActivation"}
_GELU = {"GELUActivation": "none", "GELUTanh": "tanh", "PytorchGELUTanh": "tanh"}
_MLP = {"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP", "GemmaMLP", "Gemma2MLP", "Gemma3MLP", "Phi3MLP"}
# a gated MLP's projections, in call order: (gate, up, down), or (gate_up, down) packed as Phi-3's
_LAYOUTS = (("gate_proj", "up_proj", "down_proj"), ("gate", "up", "down"), ("gate_up_proj", "down_proj"))
_ACTS = ("act_fn", "act", "activation_fn")
# (rtol, atol) of a replacement against the original, per dtype (docs/ops.md's, bf16 with room
# for the original's two roundings: x.to(bf16) * weight)
_TOL = {torch.float32: (1e-4, 1e-5), torch.float64: (1e-10, 1e-12), torch.float16: (4e-3, 1e-3),
        torch.bfloat16: (3.2e-2, 1e-2)}
# a GatedMLP's relative error as a whole (L2) against the original, per dtype: about 3x the
# activation's extra rounding in the original (bf16 0.37 %, fp16 0.04 %, on random probes); a
# GELU where a SiLU was is 3-15 % off
_TOL_MLP = {torch.float32: 1e-4, torch.float64: 1e-10, torch.float16: 2e-3, torch.bfloat16: 1e-2}


class Replaced(NamedTuple):
    """One replacement: the module's qualified name, the module that was there, the new one (for
    the rotary embedding: the function's qualified name, the function, a
    :class:`~opsmith.ops._patch_rotary.RotaryPosEmb`)."""

    name: str
    old: Any
    new: Any


class OffsetRMSNorm(_modules.RMSNorm):
    """RMS norm scaled by ``1 + weight`` (Gemma's convention; the weight starts at zero)."""

    def forward(self, x):
        from opsmith.ops import _public
        if self.inductor and _modules.compiling():
            return torch.nn.functional.rms_norm(x, self.normalized_shape, 1 + self.weight, self.eps)
        return _public.rms_norm(x, self.normalized_shape, 1 + self.weight, self.eps)


class GatedMLP(torch.nn.Module):
    """A SwiGLU/GeGLU MLP whose activation and multiply are one kernel:
    ``down(silu_mul(gate(x), up(x)))`` (``gelu_mul`` for ``activation="gelu"``), or, with two
    projections (gate and up packed in one), ``down(silu_and_mul(gate_up(x)))``.

    ``projections`` maps names to modules in call order; they become this module's children
    under those names, so a patched model keeps its state dict keys and parameters.

    Examples
    --------
    >>> mlp = GatedMLP({"gate_proj": g, "up_proj": u, "down_proj": d}, "silu")  # doctest: +SKIP
    """

    def __init__(self, projections: dict, activation: str = "silu", approximate: str = "none") -> None:
        super().__init__()
        if len(projections) not in (2, 3) or activation not in ("silu", "gelu") or approximate not in ("none", "tanh"):
            raise SpecError(f"GatedMLP takes 2 or 3 projections, activation 'silu' or 'gelu' and approximate "
                             f"'none' or 'tanh'; got {list(projections)}, {activation!r}, {approximate!r}")
        self.projections = tuple(projections)
        for name, module in projections.items():
            self.add_module(name, module)
        self.activation, self.approximate = activation, approximate

    @property
    def in_features(self) -> int | None:
        """The input width, from the first projection (``in_features`` or its weight's last dim)."""
        first = getattr(self, self.projections[0])
        width = getattr(first, "in_features", None)
        w = getattr(first, "weight", None)
        return width if isinstance(width, int) else (w.shape[-1] if isinstance(w, torch.Tensor) else None)

    inductor = False

    def forward(self, x):
        from opsmith.ops import _public as F
        *inner, down = (getattr(self, n) for n in self.projections)
        if len(inner) == 1:
            h = inner[0](x)
            if self.inductor and _modules.compiling():
                g, u = h.chunk(2, dim=-1)
                return down(self._torch_act(g) * u)
            h = F.silu_and_mul(h) if self.activation == "silu" else F.gelu_and_mul(h, self.approximate)
        else:
            g, u = inner[0](x), inner[1](x)
            if self.inductor and _modules.compiling():
                return down(self._torch_act(g) * u)
            h = F.silu_mul(g, u) if self.activation == "silu" else F.gelu_mul(g, u, self.approximate)
        return down(h)

    def _torch_act(self, g):
        f = torch.nn.functional
        return f.silu(g) if self.activation == "silu" else f.gelu(g, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}" + (f", approximate={self.approximate!r}"
                                                     if self.activation == "gelu" else "")


def _act_kind(act) -> tuple[str, str] | None:
    """``(activation, approximate)`` of a gated MLP's activation module or function, if opsmith has it."""
    t, name = type(act), type(act).__name__
    hf = t.__module__.startswith("transformers")
    if t is torch.nn.SiLU or (hf and name in _SILU) or act is torch.nn.functional.silu:
        return "silu", "none"
    if t is torch.nn.GELU and act.approximate in ("none", "tanh"):
        return "gelu", act.approximate
    if hf and name in _GELU:
        return "gelu", _GELU[name]
    if act is torch.nn.functional.gelu:
        return "gelu", "none"
    return None


def _mlp_candidates(m) -> tuple[list[torch.nn.Module], bool]:
    """A :class:`GatedMLP` for a module made of a gated MLP's projections and activation and
    nothing else (no other children, parameters or buffers of its own); known: its class is one
    of transformers' gated MLPs."""
    children = dict(m.named_children())
    for names in _LAYOUTS:
        if not all(isinstance(children.get(n), torch.nn.Module) for n in names):
            continue
        act_name = next((n for n in _ACTS if getattr(m, n, None) is not None), None)
        kind = _act_kind(getattr(m, act_name)) if act_name else None
        if kind is None or set(children) - {*names, act_name} or m._parameters or m._buffers:
            return [], False
        return [GatedMLP({n: children[n] for n in names}, *kind).train(m.training)], type(m).__name__ in _MLP
    return [], False


def _eps(m) -> float | None:
    for attr in ("variance_epsilon", "eps"):
        v = getattr(m, attr, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def _with_params(new: torch.nn.Module, old: torch.nn.Module, names=("weight", "bias")) -> torch.nn.Module:
    """``new`` holding ``old``'s parameters themselves (None where ``old`` has none)."""
    for n in names:
        p = getattr(old, n, None)
        if n not in new._parameters:
            new.__dict__.pop(n, None)  # a plain None attribute (elementwise_affine=False)
        new.register_parameter(n, p if isinstance(p, torch.nn.Parameter) else None)
    return new.train(old.training)


def _rms_candidates(m) -> list[torch.nn.Module]:
    """The replacements to try for an RMS-norm-like module, most likely first."""
    w, eps = getattr(m, "weight", None), _eps(m)
    if not isinstance(w, torch.nn.Parameter) or w.dim() != 1 or eps is None:
        return []
    name = type(m).__name__
    plain = _with_params(_modules.RMSNorm(w.shape[0], eps, elementwise_affine=True, device="meta"), m, ("weight",))
    offset = _with_params(OffsetRMSNorm(w.shape[0], eps, elementwise_affine=True, device="meta"), m, ("weight",))
    if name in _RMS_OFFSET:
        return [offset]
    if name in _RMS:
        return [plain]
    return [plain, offset] if name.endswith("RMSNorm") else []


class CrossEntropyLoss(_modules.CrossEntropyLoss):
    """What ``patch`` puts for a ``torch.nn.CrossEntropyLoss``: opsmith's kernels where they apply
    (``[N, V]`` floating logits, ``[N]`` integer targets), torch's cross-entropy otherwise."""

    inductor = False

    def forward(self, logits, target):
        if (logits.dim() == 2 and target.dim() == 1 and logits.dtype in _TOL
                and not (target.dtype.is_floating_point or target.dtype.is_complex)
                and not (self.inductor and _modules.compiling())):
            return super().forward(logits, target)
        import torch.nn.functional as F
        return F.cross_entropy(logits, target, ignore_index=self.ignore_index, reduction=self.reduction,
                               label_smoothing=self.label_smoothing)


def _loss_mismatch(old, new) -> str | None:
    """Why ``new`` cannot stand in for the loss module ``old``; None when both agree on random
    logits and targets (one of them ignored)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 11, generator=g, dtype=torch.float64)
    target = torch.randint(0, 11, (6,), generator=g)
    target[2] = old.ignore_index
    with torch.no_grad():
        want, got = old(logits, target), new(logits, target)
    return None if want.shape == got.shape and torch.allclose(got, want, rtol=1e-10, atol=1e-12) else _DIFFERS


def _candidates(m, norms: bool, activations: bool, mlps: bool,
                losses: bool = False) -> tuple[list[torch.nn.Module], bool]:
    """(replacements to try, known: recognised by type or class name rather than by shape alone)."""
    t, name = type(m), type(m).__name__
    if losses and t is torch.nn.CrossEntropyLoss and m.weight is None:
        new = CrossEntropyLoss(m.ignore_index, m.reduction, m.label_smoothing).train(m.training)
        return [new], True
    if mlps:
        tries, known = _mlp_candidates(m)
        if tries:
            return tries, known
    if norms and t is torch.nn.LayerNorm:
        new = _modules.LayerNorm(m.normalized_shape, m.eps, elementwise_affine=False)
        return [_with_params(new, m)], True
    if norms and getattr(torch.nn, "RMSNorm", None) is t:
        new = _modules.RMSNorm(m.normalized_shape, m.eps, elementwise_affine=False)
        return [_with_params(new, m, ("weight",))], True
    if norms and name.endswith("RMSNorm") and not isinstance(m, _modules.RMSNorm):
        return _rms_candidates(m), name in _RMS or name in _RMS_OFFSET
    if not activations:
        return [], False
    if t is torch.nn.ReLU:
        return [_modules.ReLU().train(m.training)], True
    if t is torch.nn.SiLU or (name in _SILU and t.__module__.startswith("transformers")):
        return [_modules.SiLU().train(m.training)], True
    if t is torch.nn.GELU:
        return [_modules.GELU(m.approximate).train(m.training)], True
    if name in _GELU and t.__module__.startswith("transformers"):
        return [_modules.GELU(_GELU[name]).train(m.training)], True
    return [], False


def _probe(old: torch.nn.Module, width: int | None = None) -> torch.Tensor | None:
    """A small random input for ``old``: its parameters' dtype and device, its feature size
    (``width`` where the replacement knows it: an MLP's input width)."""
    params = list(old.parameters(recurse=False)) or list(old.parameters())
    ref = params[0] if params else None
    if ref is not None and ref.device.type == "meta":
        return None
    dtype = ref.dtype if ref is not None and ref.dtype in _TOL else torch.float32
    device = ref.device if ref is not None else torch.device("cpu")
    shape = (((width,) if width else None) or getattr(old, "normalized_shape", None)
             or ((ref.shape[0],) if ref is not None and ref.dim() == 1 else (64,)))
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn((3, *tuple(shape)), generator=g, device=device, dtype=torch.float32) * 2 + 0.5
    return x.to(dtype)


_DIFFERS = "its output differs from opsmith's on a random input"


def _mismatch(old, new, x) -> str | None:
    """Why ``new`` cannot stand in for ``old`` on input ``x``; None when they agree."""
    with torch.no_grad():
        try:
            want = old(x)
        except Exception as exc:  # noqa: BLE001  (it only looks like what we know: leave it alone, say why)
            return f"its forward raised {type(exc).__name__} on a random input of shape {tuple(x.shape)}"
        got = new(x)  # an error here is opsmith's own: it propagates
    if not isinstance(want, torch.Tensor) or want.shape != got.shape:
        return _DIFFERS
    dtype = want.dtype if want.dtype in _TOL else torch.float32
    rtol, atol = _TOL[dtype]
    got, want = got.double(), want.double()
    if isinstance(new, GatedMLP) and bool(torch.isfinite(want).all()):
        # the down projection sums thousands of products of the activation, which opsmith rounds
        # once (float math) and the original twice (the activation, then the product): elementwise,
        # outputs near zero can differ by more than atol. Compared as a whole instead (_TOL_MLP).
        ok = float(torch.linalg.vector_norm(got - want)) <= _TOL_MLP[dtype] * float(torch.linalg.vector_norm(want))
        return None if ok else _DIFFERS
    return None if torch.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True) else _DIFFERS


def patch(model: torch.nn.Module, *, norms: bool = True, activations: bool = True, mlps: bool = True,
          losses: bool = True, rotary: bool = True, check: bool = True, skipped: list | None = None,
          under_compile: str = "inductor") -> list[Replaced]:
    """Replace the gated MLPs, norms, activations and cross-entropy losses of ``model`` that
    opsmith's ops implement, in place.

    Returns what was replaced (qualified name, old module, new module). ``skipped``, a list,
    receives ``(name, module, reason)`` for modules that looked replaceable but were left alone.
    ``mlps=False`` keeps the MLPs (their ``act_fn`` is then replaced alone, with
    ``activations``); ``losses=False`` keeps ``nn.CrossEntropyLoss`` modules; ``rotary=False``
    keeps the attention modules' ``apply_rotary_pos_emb`` (replaced process-wide otherwise, in
    its Python module; ``r.new.restore()`` puts it back). Patching a patched model replaces
    nothing more.

    ``under_compile``: what the new modules run while ``torch.compile`` traces them.
    ``"inductor"`` (the default): torch's own ops, which inductor fuses with their neighbours
    (the residual add before a norm, the cast before a loss, the projections' epilogues);
    opsmith's kernels run in eager mode only. On the Llama step of ``bench/bench_llama_step.py``
    the custom ops under compile cost 0.64 ms a step more than inductor's fused kernels (H200,
    docs/ops.md). ``"opsmith"``: opsmith's ops under compile too (each an opaque op in the graph,
    as ``torch.export`` should record them).

    Examples
    --------
    >>> model = transformers.AutoModelForCausalLM.from_config(config)  # doctest: +SKIP
    >>> [r.name for r in opsmith.ops.patch(model)][:3]                  # doctest: +SKIP
    ['model.norm', 'model.layers.0.mlp', 'model.layers.0.input_layernorm']
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"opsmith.ops.patch takes a torch.nn.Module, got {type(model).__name__}")
    if under_compile not in ("inductor", "opsmith"):
        raise SpecError(f"opsmith.ops.patch: under_compile is 'inductor' (torch's ops while torch.compile traces, "
                        f"fused by inductor) or 'opsmith' (opsmith's ops there too); got {under_compile!r}")
    inductor = under_compile == "inductor"
    done: list[Replaced] = []
    targets: list[tuple[str, Any, str, torch.nn.Module]] = []
    for parent_name, parent in model.named_modules():
        for child_name, child in parent.named_children():
            targets.append((f"{parent_name}.{child_name}" if parent_name else child_name, parent, child_name, child))
    gone: set[int] = set()  # replaced modules and their descendants: no longer in the model
    for name, parent, child_name, old in targets:
        if id(parent) in gone:  # inside a replaced module (an MLP's act_fn): the pre-order walk saw it first
            gone.add(id(old))
            continue
        tries, known = _candidates(old, norms, activations, mlps, losses)
        if not tries:
            continue
        if isinstance(tries[0], CrossEntropyLoss):  # two inputs: its own check
            why = _loss_mismatch(old, tries[0]) if check else None
            if why is not None:
                if skipped is not None:
                    skipped.append((name, old, why))
                continue
            tries[0].inductor = inductor
            setattr(parent, child_name, tries[0])
            gone.add(id(old))
            done.append(Replaced(name, old, tries[0]))
            continue
        x = _probe(old, getattr(tries[0], "in_features", None)) if check or not known else None
        chosen, why = None, "recognised only by its shape, and it has no data to check (meta device)"
        for new in tries:
            if x is None:
                if known:  # a meta model (no data to run): trust the type or class name
                    chosen = new
                break
            why = _mismatch(old, new, x)
            if why is None:
                chosen = new
                break
        if chosen is None:
            if skipped is not None:
                skipped.append((name, old, why))
            continue
        chosen.inductor = inductor
        setattr(parent, child_name, chosen)
        gone.add(id(old))
        done.append(Replaced(name, old, chosen))
    # functions: transformers' loss_function (this model's) and apply_rotary_pos_emb (process-wide)
    functions = (*(_patch_loss.candidates(model) if losses else ()),
                 *(_patch_rotary.candidates(model) if rotary else ()))
    for name, original, new, why in functions:
        if new is None:
            if skipped is not None:
                skipped.append((name, original, why))
            continue
        new.inductor = inductor
        new.install()
        done.append(Replaced(name, original, new))
    return done
