"""opsmith.ops.patch's replaced functions on CPU: the rotary embedding (transformers'
``apply_rotary_pos_emb`` of an attention class's Python module, process-wide) and transformers'
causal-LM ``loss_function`` (per model): replaced where they agree with opsmith's ops on a random
input, left alone and reported where they do not, their fallbacks, compile, tiny transformers
models' losses and gradients."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_patch import _graph_ops, restore_rotary

from opsmith import ops
from opsmith.ops._patch_loss import CausalLMLoss
from opsmith.ops._patch_rotary import NAME, RotaryPosEmb

# -- the rotary embedding function ------------------------------------------------------------------------------
_ATTENTION_SOURCE = """
import torch

def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

class MyAttention(torch.nn.Module):
    def forward(self, q, k, cos, sin):
        return apply_rotary_pos_emb(q, k, cos, sin)
"""
_GPTJ = """
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):  # interleaved pairs: another layout
    def rot(x):
        return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rot(q) * sin, k * cos + rot(k) * sin
"""


def _attention_module(name: str, extra: str = ""):
    import types
    module = types.ModuleType(name)
    exec(_ATTENTION_SOURCE + extra, vars(module))
    return module


def test_rotary_function_is_replaced_checked_and_falls_back_where_it_does_not_apply():
    module = _attention_module("my_attention")
    original = module.apply_rotary_pos_emb
    model = torch.nn.ModuleDict({"attn": module.MyAttention(), "norm": torch.nn.LayerNorm(8)})
    done = ops.patch(model, norms=False)
    assert [(r.name, r.old) for r in done] == [(f"my_attention.{NAME}", original)]
    new = module.apply_rotary_pos_emb
    assert isinstance(new, RotaryPosEmb) and new.__doc__ == original.__doc__ and "my_attention" in repr(new)
    q = torch.randn(2, 5, 4, 8, dtype=torch.float64).transpose(1, 2).requires_grad_()  # [b, h, s, d], a view
    k = torch.randn(2, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    ang = torch.randn(2, 5, 8, dtype=torch.float64)
    cos, sin = ang.cos(), ang.sin()  # halves that differ: exact all the same
    for args, kwargs in (((), {}), ((1,), {}), ((), {"unsqueeze_dim": 1})):
        got, want = new(q, k, cos, sin, *args, **kwargs), original(q, k, cos, sin, *args, **kwargs)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
    gq, gk = torch.autograd.grad(sum(t.square().sum() for t in new(q, k, cos, sin)), (q, k))
    wq, wk = torch.autograd.grad(sum(t.square().sum() for t in original(q, k, cos, sin)), (q, k))
    torch.testing.assert_close(gq, wq)
    torch.testing.assert_close(gk, wk)
    qs = q.detach().transpose(1, 2)  # [b, s, h, d] with unsqueeze_dim=2
    for g, w in zip(new(qs, qs, cos, sin, unsqueeze_dim=2), original(qs, qs, cos, sin, unsqueeze_dim=2)):
        torch.testing.assert_close(g, w)
    # what the kernel does not take runs the original: partial tables, tables that want a gradient,
    # mixed dtypes, unknown arguments (the original's own error)
    calls = []
    new.original = lambda *a, **kw: calls.append(len(a) + len(kw)) or original(*a, **kw)
    with pytest.raises(RuntimeError):  # narrower tables: the original's own broadcasting error
        new(q, k, cos[..., :4], sin[..., :4])
    new(q.detach(), k.detach(), cos.clone().requires_grad_(), sin)
    new(q.detach().float(), k.detach(), cos, sin)
    with pytest.raises(TypeError):
        new(q, k, cos, sin, foo=1)
    assert calls == [4, 4, 4, 5]
    new.original = original
    assert ops.patch(model, norms=False) == []  # replaced already
    assert new.restore() and module.apply_rotary_pos_emb is original
    assert ops.patch(model, norms=False, rotary=False) == []


def test_rotary_functions_that_differ_are_left_alone():
    gptj = _attention_module("gptj_attention", _GPTJ)
    other = _attention_module("other_attention", "\ndef apply_rotary_pos_emb(q, k, cos, sin, pos):\n    return q, k\n")
    model = torch.nn.ModuleDict({"a": gptj.MyAttention(), "b": other.MyAttention()})
    skipped = []
    assert ops.patch(model, skipped=skipped) == []
    assert [(n, why) for n, _, why in skipped] == [
        (f"gptj_attention.{NAME}", "its output differs from opsmith's rotary_embedding on a random input"),
        (f"other_attention.{NAME}", "it raised TypeError on a random q, k, cos, sin")]
    assert not isinstance(gptj.apply_rotary_pos_emb, RotaryPosEmb)


# the kernels package's use_kernel_forward_from_hub on a function (transformers 5 with kernels installed): an instance
# of an nn.Module class whose forward calls the function it closes over
_HUB_FUNC = """
def _hub_module(func):
    class Func(torch.nn.Module):
        def forward(self, *args, **kwargs):
            return func(*args, **kwargs)
    return Func()

apply_rotary_pos_emb = _hub_module(apply_rotary_pos_emb)
"""


def test_rotary_function_made_a_module_by_hub_kernels_is_replaced_and_restored():
    module = _attention_module("hub_attention", _HUB_FUNC)
    original = module.apply_rotary_pos_emb
    assert isinstance(original, torch.nn.Module)
    (r,) = ops.patch(torch.nn.Sequential(module.MyAttention()), norms=False)
    new = module.apply_rotary_pos_emb
    assert r.name == f"hub_attention.{NAME}" and r.old is original and isinstance(new, RotaryPosEmb)
    assert new.__name__ == NAME and new._unsqueeze == 1  # the signature of the function behind the module
    q, k = torch.randn(2, 4, 5, 8, dtype=torch.float64), torch.randn(2, 2, 5, 8, dtype=torch.float64)
    ang = torch.randn(2, 5, 8, dtype=torch.float64)
    for g, w in zip(new(q, k, ang.cos(), ang.sin(), unsqueeze_dim=1), original(q, k, ang.cos(), ang.sin())):
        torch.testing.assert_close(g, w)
    assert new.restore() and module.apply_rotary_pos_emb is original


def test_a_rotary_callable_that_is_no_function_is_reported():
    module = _attention_module("opaque_attention", "\napply_rotary_pos_emb = torch.nn.Identity()\n")
    skipped = []
    assert ops.patch(torch.nn.Sequential(module.MyAttention()), skipped=skipped) == []
    why = "it is an object of class Identity, not a function"
    assert [(n, w) for n, _, w in skipped] == [(f"opaque_attention.{NAME}", why)]
    assert isinstance(module.apply_rotary_pos_emb, torch.nn.Identity)


def test_rotary_under_compile_is_inductors_by_default():
    module = _attention_module("compiled_attention")
    original = module.apply_rotary_pos_emb
    attn = module.MyAttention()
    (r,) = ops.patch(torch.nn.Sequential(attn))
    assert r.new.inductor
    q, k = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    ang = torch.randn(1, 4, 8)
    names = _graph_ops(attn, q, k, ang.cos(), ang.sin())
    assert not any("opsmith" in n for n in names) and any("cat" in n for n in names)
    torch._dynamo.reset()
    got = torch.compile(attn, backend="aot_eager", dynamic=False)(q, k, ang.cos(), ang.sin())
    torch._dynamo.reset()
    for g, w in zip(got, original(q, k, ang.cos(), ang.sin())):
        torch.testing.assert_close(g, w)


# -- transformers' causal-LM loss function ------------------------------------------------------------------------
def _hf_loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None, **kwargs):
    """transformers' ForCausalLMLoss, written out (upcast, shift, flatten, mean or sum / items)."""
    logits = logits.float()
    if shift_labels is None:
        shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:].contiguous()
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = torch.nn.functional.cross_entropy(logits.view(-1, vocab_size), shift_labels.view(-1).to(logits.device),
                                             ignore_index=ignore_index, reduction=reduction)
    return loss / num_items_in_batch if reduction == "sum" else loss


_hf_loss.__module__, _hf_loss.__name__ = "transformers.loss.loss_utils", "ForCausalLMLoss"


class _CausalLM(torch.nn.Module):
    """A model with transformers' loss_function property (and an inner model with one too)."""

    def __init__(self, fn=_hf_loss, inner: bool = True):
        super().__init__()
        self.fn = fn
        self.head = torch.nn.Linear(8, 11)
        if inner:
            self.model = _CausalLM(fn, inner=False)

    @property
    def loss_function(self):
        return getattr(self, "_loss_function", self.fn)

    @loss_function.setter
    def loss_function(self, value):
        self._loss_function = value

    def forward(self, h, labels, **kw):
        return self.loss_function(self.head(h), labels, 11, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_causal_lm_loss_matches_transformers_without_the_float_copy(dtype):
    model = _CausalLM().to(dtype)
    h = torch.randn(2, 6, 8, dtype=dtype)
    labels = torch.randint(0, 11, (2, 6))
    labels[1, :2] = -100
    other = labels.clamp(min=0)  # ignore_index 3: no -100 left
    cases = ((labels, {}), (labels, {"num_items_in_batch": torch.tensor(9)}), (labels, {"num_items_in_batch": 9}),
             (labels, {"shift_labels": labels.roll(-1, 1)}), (other, {"ignore_index": 3}),
             (labels, {"output_attentions": False}))
    wants = []
    for lab, kw in cases:
        model.zero_grad(set_to_none=True)
        loss = model(h, lab, **kw)
        loss.backward()
        wants.append((loss.detach(), [p.grad.clone() for p in model.head.parameters()]))
    (r,) = ops.patch(model)
    assert r.name == "loss_function" and r.old is _hf_loss and isinstance(model.loss_function, CausalLMLoss)
    assert model.model.loss_function is _hf_loss and "ForCausalLMLoss" in repr(r.new)
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {}
    for (lab, kw), (want, grads) in zip(cases, wants):
        model.zero_grad(set_to_none=True)
        loss = model(h, lab, **kw)
        assert loss.dtype == torch.float32  # as transformers' (its logits.float())
        torch.testing.assert_close(loss.detach(), want, rtol=1e-5, atol=1e-6)  # the value in float32 either way
        loss.backward()
        for p, g in zip(model.head.parameters(), grads):
            torch.testing.assert_close(p.grad, g, **tol)
    assert ops.patch(model) == [] and ops.patch(_CausalLM(), losses=False) == []


def test_causal_lm_loss_falls_back_and_differing_functions_are_left_alone():
    calls = []

    def spy(*a, **kw):
        calls.append(1)
        return _hf_loss(*a, **kw)
    new = CausalLMLoss(_hf_loss)
    new.original = spy
    logits, labels = torch.randn(2, 4, 11), torch.randint(0, 11, (2, 4))
    # int32 labels, labels of another shape, a vocabulary size that is not the logits' last dim, integer
    # logits: the original runs (and raises its own error where it has one)
    for args in ((logits, labels.int(), 11), (logits, labels[:, :3], 11), (logits, labels, 4),
                 (logits.long(), labels, 11)):
        try:
            new(*args)
        except (RuntimeError, ValueError):
            pass
    assert len(calls) == 4

    def summed(logits, labels, vocab_size, **kw):  # named like transformers', computing something else
        return torch.nn.functional.cross_entropy(logits.float().view(-1, vocab_size), labels.view(-1), reduction="sum")
    summed.__module__, summed.__name__ = _hf_loss.__module__, _hf_loss.__name__
    skipped = []
    assert ops.patch(_CausalLM(summed), skipped=skipped) == []
    why = "its loss differs from opsmith's cross_entropy on random logits"
    assert [(n, w) for n, _, w in skipped] == [("loss_function", why)]
    other = _CausalLM(lambda logits, labels, vocab_size, **kw: logits.sum())  # another loss: not looked at
    assert ops.patch(other) == [] and not isinstance(other.loss_function, CausalLMLoss)


def test_causal_lm_loss_under_compile_is_inductors_by_default():
    model = _CausalLM(inner=False)
    (r,) = ops.patch(model)
    assert r.new.inductor
    h, labels = torch.randn(2, 6, 8), torch.randint(0, 11, (2, 6))
    names = _graph_ops(model, h, labels)
    assert not any("opsmith" in n for n in names)
    (r,) = ops.patch(_CausalLM(inner=False), under_compile="opsmith")
    names = _graph_ops(r.new, model.head(h), labels, 11)
    assert any("opsmith.cross_entropy" in n for n in names), names


def test_causal_lm_loss_restore_gives_the_model_its_function_back():
    model = _CausalLM(inner=False)
    (r,) = ops.patch(model)
    assert model.loss_function is r.new and r.new.restore() and model.loss_function is _hf_loss
    assert not r.new.restore() and not CausalLMLoss(_hf_loss).restore()  # nothing to give back, no owner
