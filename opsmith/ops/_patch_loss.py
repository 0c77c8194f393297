"""``opsmith.ops.patch``'s causal-LM loss: transformers' ``model.loss_function``.

transformers' ``*ForCausalLM`` models compute their loss with a function, ``self.loss_function``
(``ForCausalLMLoss`` in ``transformers.loss.loss_utils``): it upcasts the logits to float32 (a
copy of ``[tokens, vocab]`` floats, and its cast back in the backward), shifts the labels, and
runs torch's cross-entropy, averaged over the valid tokens or summed and divided by
``num_items_in_batch``. :class:`CausalLMLoss` computes the same with opsmith's cross-entropy on
the logits as they are (its kernels upcast each value as they read it: float32 math, no copy).

The loss value is float32, as transformers' (float64 logits too): the kernel's loss has the logits' dtype, so the
returned value is recomputed in float32 from the kernel's float32 log-sum-exp and the target
logits (a few small kernels over ``[tokens]``), and the gradient flows through the kernel's loss.
With ``num_items_in_batch`` the gradient's scale ``1 / num_items_in_batch`` reaches the kernel
in the logits' dtype (bf16: within 0.4 %, the precision of the gradient itself).

Calls it does not cover (integer logits, labels that are not int64, a vocabulary size that is not
the logits' last dim) run the original; other keyword arguments (the model's forward passes its
own along) are ignored, as the original ignores them. The original also runs while
``torch.compile`` traces where ``under_compile="inductor"``: Inductor fuses the upcast into its
own cross-entropy.
"""
from __future__ import annotations

import functools
import weakref

import torch

from opsmith.ops import _modules

__all__ = ["CausalLMLoss", "candidates"]

_ORIGINAL = ("transformers.loss.loss_utils", "ForCausalLMLoss")


class CausalLMLoss:
    """transformers' ``ForCausalLMLoss(logits, labels, vocab_size, num_items_in_batch=None,
    ignore_index=-100, shift_labels=None, **kwargs)`` on opsmith's cross-entropy; ``original``
    is the replaced function."""

    inductor = False

    def __init__(self, original, owner: torch.nn.Module | None = None) -> None:
        functools.update_wrapper(self, original)
        self.original = original
        self._owner = weakref.ref(owner) if owner is not None else None  # the model whose loss_function it is

    def install(self) -> None:
        """Become the owner's ``loss_function`` (transformers' property setter: that model alone)."""
        self._owner().loss_function = self

    def restore(self) -> bool:
        """Give the owner its original loss function back (False where it holds another now)."""
        owner = self._owner() if self._owner is not None else None
        if owner is None or owner.__dict__.get("_loss_function") is not self:
            return False
        del owner._loss_function
        return True

    def __call__(self, logits, labels, vocab_size, num_items_in_batch=None, ignore_index: int = -100,
                 shift_labels=None, **kwargs):
        if (self.inductor and _modules.compiling()) or not _covers(logits, labels, vocab_size, shift_labels):
            return self.original(logits, labels, vocab_size, num_items_in_batch=num_items_in_batch,
                                 ignore_index=ignore_index, shift_labels=shift_labels, **kwargs)
        if shift_labels is None:  # tokens < n predict n
            shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
        logits = logits.reshape(-1, vocab_size)
        target = shift_labels.reshape(-1).to(logits.device)
        reduction = "sum" if num_items_in_batch is not None else "mean"
        from opsmith.ops import _public
        loss, lse, count = _public._call("cross_entropy")(logits, target, int(ignore_index), reduction, 0.0, 0.0)
        with torch.no_grad():  # the value in float32: the valid rows' lse - logits[row, target]
            valid = target != ignore_index
            picked = logits.gather(1, (target * valid)[:, None])[:, 0]
            exact = (lse - picked).mul_(valid).sum()
            if reduction == "mean":
                exact /= count[0]
        out = _Exact.apply(loss, exact.float())  # float32, as transformers' (its logits.float())
        if reduction == "sum":
            if torch.is_tensor(num_items_in_batch):
                num_items_in_batch = num_items_in_batch.to(out.device)
            out = out / num_items_in_batch
        return out

    def __repr__(self) -> str:
        return f"CausalLMLoss({self.original.__module__}.{self.original.__name__})"


class _Exact(torch.autograd.Function):
    """``exact`` as the value, the gradient to ``loss`` (one autograd node: few host calls)."""

    @staticmethod
    def forward(ctx, loss, exact):
        ctx.dtype = loss.dtype
        return exact.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.dtype), None


def _covers(logits, labels, vocab_size, shift_labels) -> bool:
    target = shift_labels if shift_labels is not None else labels
    return (isinstance(logits, torch.Tensor) and isinstance(target, torch.Tensor)
            and logits.dtype in _modules.FLOATS
            and logits.dim() >= 2 and logits.shape[-1] == vocab_size and target.dtype == torch.long
            and target.numel() * vocab_size == logits.numel())


def _is_original(fn) -> bool:
    return (getattr(fn, "__module__", None), getattr(fn, "__name__", None)) == _ORIGINAL \
        and not isinstance(fn, CausalLMLoss)


def _mismatch(original, new: CausalLMLoss) -> str | None:
    """Why ``new`` cannot stand in for ``original``: both run on random logits with some labels
    ignored, averaged, divided by a token count, and with labels shifted by the caller."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=g)
    labels = torch.randint(0, 11, (2, 5), generator=g)
    labels[0, 2] = labels[1, 4] = -100
    cases = ({}, {"num_items_in_batch": torch.tensor(7)}, {"shift_labels": labels.roll(-1, 1)})
    with torch.no_grad():
        for kw in cases:
            try:
                want = original(logits, labels, 11, **kw)
            except Exception as exc:  # noqa: BLE001  (only its name looked like transformers': leave it, say why)
                return f"it raised {type(exc).__name__} on random logits and labels"
            got = new(logits, labels, 11, **kw)
            if not (isinstance(want, torch.Tensor) and want.shape == got.shape
                    and want.dtype == got.dtype and torch.allclose(got, want, rtol=1e-5, atol=1e-6)):
                return "its loss differs from opsmith's cross_entropy on random logits"
    return None


def candidates(model: torch.nn.Module):
    """``(qualified name, original, replacement or None, why not)`` for each module of
    ``model`` whose ``loss_function`` (a property, as transformers' ``PreTrainedModel``) is
    transformers' ``ForCausalLMLoss``, the outermost only (a ``LlamaForCausalLM``, not the
    ``LlamaModel`` inside it, whose loss function nothing calls)."""
    outer: list[str] = []
    for name, m in model.named_modules():
        if not isinstance(getattr(type(m), "loss_function", None), property):
            continue
        if any(name.startswith(o + ".") or o == "" for o in outer):
            continue
        outer.append(name)
        try:
            original = m.loss_function
        except Exception:  # noqa: BLE001, S112  (a property that fails here is not the one we know)
            continue
        if not _is_original(original):
            continue
        new = CausalLMLoss(original, m)
        why = _mismatch(original, new)
        yield f"{name}.loss_function" if name else "loss_function", original, (new if why is None else None), why
