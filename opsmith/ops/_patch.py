"""``opsmith.ops.patch(model)``: opsmith's ops in an existing model, one line.

It walks a ``torch.nn.Module`` tree and replaces, in place, the modules it recognises:

- norms: ``torch.nn.LayerNorm`` and ``torch.nn.RMSNorm``; the RMS norms of Hugging Face
  ``transformers`` by class name (Llama, Mistral, Mixtral, Qwen2/3 (and MoE), Phi-3: ``x *
  rsqrt(mean(x²) + eps) * weight``; Gemma, Gemma 2 and 3: ``... * (1 + weight)``), and any other
  module named ``*RMSNorm`` with a 1-d ``weight`` and an ``eps``/``variance_epsilon`` whose
  output matches one of those two forms;
- activations: ``torch.nn.ReLU``, ``SiLU`` and ``GELU``, and ``transformers``' ``SiLUActivation``,
  ``GELUActivation`` and ``GELUTanh``/``PytorchGELUTanh`` (the SwiGLU/GeGLU MLPs' ``act_fn``).

The new modules hold the old ones' parameters (the same ``Parameter`` objects: state dicts,
optimisers and tied weights are untouched) and their train/eval mode. Before a replacement
stays, both modules run on a small random input of the parameters' dtype and device and must
agree within that dtype's tolerance (``check=False`` skips it); a module that does not is left
alone and reported. Nothing is fused yet (``act_fn(gate) * up`` keeps its multiply).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch

from opsmith.ops import _modules

__all__ = ["Replaced", "patch"]

_RMS = {"LlamaRMSNorm", "MistralRMSNorm", "MixtralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm",
        "Qwen2MoeRMSNorm", "Qwen3MoeRMSNorm", "Phi3RMSNorm"}
_RMS_OFFSET = {"GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm"}
_SILU = {"SiLU", "SiLUActivation"}
_GELU = {"GELUActivation": "none", "GELUTanh": "tanh", "PytorchGELUTanh": "tanh"}
# (rtol, atol) of a replacement against the original, per dtype (docs/ops.md's, bf16 with room
# for the original's two roundings: x.to(bf16) * weight)
_TOL = {torch.float32: (1e-4, 1e-5), torch.float64: (1e-10, 1e-12), torch.float16: (4e-3, 1e-3),
        torch.bfloat16: (3.2e-2, 1e-2)}


class Replaced(NamedTuple):
    """One replacement: the module's qualified name, the module that was there, the new one."""

    name: str
    old: torch.nn.Module
    new: torch.nn.Module


class OffsetRMSNorm(_modules.RMSNorm):
    """RMS norm scaled by ``1 + weight`` (Gemma's convention; the weight starts at zero)."""

    def forward(self, x):
        from opsmith.ops import _public
        return _public.rms_norm(x, self.normalized_shape, 1 + self.weight, self.eps)


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


def _candidates(m, norms: bool, activations: bool) -> tuple[list[torch.nn.Module], bool]:
    """(replacements to try, known: recognised by type or class name rather than by shape alone)."""
    t, name = type(m), type(m).__name__
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


def _probe(old: torch.nn.Module) -> torch.Tensor | None:
    """A small random input for ``old``: its parameters' dtype and device, its feature size."""
    params = list(old.parameters(recurse=False))
    ref = params[0] if params else None
    if ref is not None and ref.device.type == "meta":
        return None
    dtype = ref.dtype if ref is not None and ref.dtype in _TOL else torch.float32
    device = ref.device if ref is not None else torch.device("cpu")
    shape = getattr(old, "normalized_shape", None) or ((ref.shape[0],) if ref is not None and ref.dim() == 1 else (64,))
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn((3, *tuple(shape)), generator=g, device=device, dtype=torch.float32) * 2 + 0.5
    return x.to(dtype)


def _agrees(old, new, x) -> bool:
    with torch.no_grad():
        want, got = old(x), new(x)
    if not isinstance(want, torch.Tensor) or want.shape != got.shape:
        return False
    rtol, atol = _TOL.get(want.dtype, _TOL[torch.float32])
    return bool(torch.allclose(got.double(), want.double(), rtol=rtol, atol=atol, equal_nan=True))


def patch(model: torch.nn.Module, *, norms: bool = True, activations: bool = True, check: bool = True,
          skipped: list | None = None) -> list[Replaced]:
    """Replace the norm and activation modules of ``model`` that opsmith's ops implement, in place.

    Returns what was replaced (qualified name, old module, new module). ``skipped``, a list,
    receives ``(name, module, reason)`` for modules that looked replaceable but were left alone.
    Patching a patched model replaces nothing more.

    Examples
    --------
    >>> model = transformers.AutoModelForCausalLM.from_config(config)  # doctest: +SKIP
    >>> [r.name for r in opsmith.ops.patch(model)][:2]                  # doctest: +SKIP
    ['model.layers.0.mlp.act_fn', 'model.layers.0.input_layernorm']
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"opsmith.ops.patch takes a torch.nn.Module, got {type(model).__name__}")
    done: list[Replaced] = []
    targets: list[tuple[str, Any, str, torch.nn.Module]] = []
    for parent_name, parent in model.named_modules():
        for child_name, child in parent.named_children():
            targets.append((f"{parent_name}.{child_name}" if parent_name else child_name, parent, child_name, child))
    for name, parent, child_name, old in targets:
        tries, known = _candidates(old, norms, activations)
        if not tries:
            continue
        x = _probe(old) if check or not known else None
        chosen = None
        for new in tries:
            if x is None:
                if known:  # a meta model (no data to run): trust the type or class name
                    chosen = new
                break
            if _agrees(old, new, x):
                chosen = new
                break
        if chosen is None:
            if skipped is not None:
                why = ("its output differs from opsmith's on a random input" if x is not None
                       else "recognised only by its shape, and it has no data to check (meta device)")
                skipped.append((name, old, why))
            continue
        setattr(parent, child_name, chosen)
        done.append(Replaced(name, old, chosen))
    return done
