"""opsmith.ops.patch on CPU: torch's own modules, SwiGLU/GeGLU MLPs (by structure: the bench
model's; by class name: transformers'), tiny random-initialised Hugging Face models of the Llama,
Mistral, Qwen2/3, Gemma 1/2/3 and Phi-3 families (no weights downloaded), their rotary embedding
function, modules and functions that only look like an RMS norm, an MLP or a rotary embedding,
meta models, idempotence."""
from __future__ import annotations

import importlib

import pytest
from bench_files import load as load_bench  # tests/ops/bench_files.py (pytest puts tests/ops on the path)

torch = pytest.importorskip("torch")

from opsmith import ops  # noqa: E402
from opsmith._errors import SpecError  # noqa: E402
from opsmith.ops import _modules  # noqa: E402
from opsmith.ops._patch import GatedMLP  # noqa: E402
from opsmith.ops._patch_loss import CausalLMLoss  # noqa: E402
from opsmith.ops._patch_rotary import NAME, RotaryPosEmb  # noqa: E402


@pytest.fixture(autouse=True)
def restore_rotary():
    """patch replaces apply_rotary_pos_emb process-wide: each test starts and ends with the originals."""
    import sys
    yield
    for module in list(sys.modules.values()):
        f = getattr(module, NAME, None) if module is not None else None
        if isinstance(f, RotaryPosEmb):
            assert f.restore()


def _kind(r) -> str:
    if isinstance(r.new, RotaryPosEmb):
        return "rotary"
    return "loss" if isinstance(r.new, CausalLMLoss) else type(r.old).__name__


def test_torch_modules_are_replaced_keeping_their_parameters():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.SiLU(),
                                torch.nn.Linear(32, 32), torch.nn.RMSNorm(32, eps=1e-6), torch.nn.GELU("tanh"),
                                torch.nn.LayerNorm(32, elementwise_affine=False), torch.nn.ReLU())
    with torch.no_grad():
        model[1].weight.uniform_(0.5, 1.5)
        model[4].weight.uniform_(0.5, 1.5)
    x = torch.randn(5, 16)
    want = model(x)
    weight = model[1].weight
    done = ops.patch(model)
    assert [r.name for r in done] == ["1", "2", "4", "5", "6", "7"]
    assert [type(m).__name__ for m in model] == ["Linear", "LayerNorm", "SiLU", "Linear", "RMSNorm", "GELU",
                                                 "LayerNorm", "ReLU"]
    assert isinstance(model[1], _modules.LayerNorm) and model[1].weight is weight  # the same Parameter
    assert model[6].weight is None and model[5].approximate == "tanh" and model[4].eps == 1e-6
    torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-6)
    assert ops.patch(model) == []  # patched already


def test_state_dict_keys_and_training_survive(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)).eval()
    keys = sorted(model.state_dict())
    ops.patch(model)
    assert sorted(model.state_dict()) == keys and not model[1].training
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 8)).square().sum().backward()
    opt.step()  # the optimiser holds the same parameters


class LooksLikeRMSNorm(torch.nn.Module):
    """Named like an RMS norm, with a weight and an eps, but computing something else."""

    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = 1e-6

    def forward(self, x):
        return x * self.weight + 1


class CustomRMSNorm(torch.nn.Module):
    """An RMS norm of another library: found by its name and shape, kept because it matches."""

    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(n) + 0.5)
        self.variance_epsilon = 1e-6

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon) * self.weight


def test_structure_is_checked_by_running_both():
    model = torch.nn.ModuleDict({"a": LooksLikeRMSNorm(16), "b": CustomRMSNorm(16)})
    skipped = []
    done = ops.patch(model, skipped=skipped)
    assert [r.name for r in done] == ["b"] and isinstance(model["b"], _modules.RMSNorm)
    assert [(n, why) for n, _, why in skipped] == [("a", "its output differs from opsmith's on a random input")]
    assert isinstance(model["a"], LooksLikeRMSNorm)


def test_meta_models_trust_only_names():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.LayerNorm(8), CustomRMSNorm(8))
    skipped = []
    done = ops.patch(model, skipped=skipped)
    assert [r.name for r in done] == ["0"] and [n for n, _, _ in skipped] == ["1"]


def test_bad_argument():
    with pytest.raises(TypeError, match="takes a torch.nn.Module"):
        ops.patch("model")


FAMILIES = {
    # family: (config class, extra config, RMS norm class, MLP class, (activation, approximate))
    "llama": ("LlamaConfig", {}, "LlamaRMSNorm", "LlamaMLP", ("silu", "none")),
    "mistral": ("MistralConfig", {}, "MistralRMSNorm", "MistralMLP", ("silu", "none")),
    "qwen2": ("Qwen2Config", {}, "Qwen2RMSNorm", "Qwen2MLP", ("silu", "none")),
    "qwen3": ("Qwen3Config", {"head_dim": 16}, "Qwen3RMSNorm", "Qwen3MLP", ("silu", "none")),
    "gemma": ("GemmaConfig", {"head_dim": 16}, "GemmaRMSNorm", "GemmaMLP", ("gelu", "tanh")),
    "gemma2": ("Gemma2Config", {"head_dim": 16}, "Gemma2RMSNorm", "Gemma2MLP", ("gelu", "tanh")),
    "gemma3": ("Gemma3TextConfig", {"head_dim": 16}, "Gemma3RMSNorm", "Gemma3MLP", ("gelu", "tanh")),
    "phi3": ("Phi3Config", {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 1}, "Phi3RMSNorm", "Phi3MLP",
             ("silu", "none")),  # gate and up packed in one projection: silu_and_mul
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tiny_transformers_models_keep_their_outputs(family):
    transformers = pytest.importorskip("transformers")
    cfg_name, extra, norm_name, mlp_name, act = FAMILIES[family]
    cfg_cls = getattr(transformers, cfg_name, None)
    if cfg_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {cfg_name}")
    torch.manual_seed(0)
    config = cfg_cls(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **extra)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # random norm weights: a wrong convention (w vs 1 + w) would show
        for m in model.modules():
            if type(m).__name__ == norm_name:
                m.weight.uniform_(-0.5, 0.5) if family.startswith("gemma") else m.weight.uniform_(0.5, 1.5)
    ids = torch.randint(0, 128, (2, 12))
    labels = ids.clone()
    labels[0, 3] = -100
    out = model(ids, labels=labels)  # logits, and the loss's gradients, before patch
    out.loss.backward()
    want, want_loss = out.logits.detach(), out.loss.detach()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    norms_before = sum(type(m).__name__ == norm_name for m in model.modules())
    state = dict(model.state_dict(keep_vars=True))
    done = ops.patch(model)
    assert {_kind(r) for r in done} == {norm_name, mlp_name, "rotary", "loss"}, [r.name for r in done]
    assert [r.name for r in done if _kind(r) == "loss"] == ["loss_function"]  # the causal LM's, not its inner model's
    assert isinstance(model.loss_function, CausalLMLoss) and not isinstance(model.model.loss_function, CausalLMLoss)
    module = importlib.import_module(type(model).__module__)  # the modeling module: it holds the attention too
    (rot,) = [r for r in done if _kind(r) == "rotary"]
    assert rot.name == f"{module.__name__}.{NAME}" and getattr(module, NAME) is rot.new and rot.new.original is rot.old
    assert sum(type(r.old).__name__ == norm_name for r in done) == norms_before
    assert not any(type(m).__name__ in (norm_name, mlp_name) for m in model.modules())
    mlps = [r for r in done if type(r.old).__name__ == mlp_name]
    assert [r.name for r in mlps] == [f"model.layers.{i}.mlp" for i in range(2)]  # act_fn not replaced on its own
    assert all(isinstance(r.new, GatedMLP) and (r.new.activation, r.new.approximate) == act for r in mlps)
    assert all(getattr(r.new, n) is getattr(r.old, n) for r in mlps for n in r.new.projections)  # same Linears
    after = dict(model.state_dict(keep_vars=True))
    assert list(after) == list(state) and all(after[k] is state[k] for k in state)  # the same Parameter objects
    out = model(ids, labels=labels)
    torch.testing.assert_close(out.logits.detach(), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.loss.detach(), want_loss, rtol=1e-5, atol=1e-6)
    assert out.loss.dtype == torch.float32
    out.loss.backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=1e-5, msg=n)
    assert ops.patch(model) == []
    assert rot.new.restore() and getattr(module, NAME) is rot.old and not rot.new.restore()


# -- gated MLPs ---------------------------------------------------------------------------------------------------
def _bench_models(layers: int):
    """The bench's Llama twice with the same weights (one to patch, one to compare), tokens, labels."""
    bench = load_bench("bench_llama_step")  # its model is written out there
    torch.manual_seed(0)
    model = bench.Llama(vocab=64, hidden=32, inter=48, heads=4, layers=layers, seq=16)
    ref = bench.Llama(vocab=64, hidden=32, inter=48, heads=4, layers=layers, seq=16)
    ref.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 64, (2, 16))
    return model, ref, tokens, torch.roll(tokens, -1, dims=1)


def test_the_bench_models_mlp_is_fused_and_trains_the_same():
    model, ref, tokens, labels = _bench_models(2)
    want = ref(tokens, labels)  # before patch: its rotary function is replaced for every model of the module
    want.backward()
    mlp = model.layers[0].mlp
    done = ops.patch(model)
    assert sorted(r.name for r in done if isinstance(r.new, GatedMLP)) == ["layers.0.mlp", "layers.1.mlp"]
    assert sum(isinstance(r.new, _modules.RMSNorm) for r in done) == 5 and len(done) == 9
    assert [r.name for r in done if isinstance(r.new, _modules.CrossEntropyLoss)] == ["loss"]
    assert [r.name for r in done if isinstance(r.new, RotaryPosEmb)] == [f"bench_llama_step.{NAME}"]
    new = model.layers[0].mlp
    assert new.projections == ("gate", "up", "down") and new.gate is mlp.gate and new.down is mlp.down
    assert not hasattr(new, "act") and new.activation == "silu"
    loss = model(tokens, labels)
    torch.testing.assert_close(loss, want)
    loss.backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


class _Proj(torch.nn.Module):
    """gate_proj/up_proj/down_proj and an act_fn, with a forward of the caller's choosing."""

    def __init__(self, forward, extra: bool = False, width: int = 8, inner: int = 16):
        super().__init__()
        self.gate_proj, self.up_proj = torch.nn.Linear(width, inner), torch.nn.Linear(width, inner)
        self.down_proj, self.act_fn = torch.nn.Linear(inner, width), torch.nn.SiLU()
        if extra:
            self.dropout = torch.nn.Dropout(0.0)
        self._f = forward

    def forward(self, *args):
        return self._f(self, *args)


def test_mlps_are_checked_by_running_both():
    swiglu = _Proj(lambda m, x: m.down_proj(m.act_fn(m.gate_proj(x)) * m.up_proj(x)))
    added = _Proj(lambda m, x: m.down_proj(m.act_fn(m.gate_proj(x)) + m.up_proj(x)))  # other math
    two_args = _Proj(lambda m, x, mask: m.down_proj(m.act_fn(m.gate_proj(x)) * m.up_proj(x) * mask))
    dropout = _Proj(lambda m, x: m.dropout(m.down_proj(m.act_fn(m.gate_proj(x)) * m.up_proj(x))), extra=True)
    model = torch.nn.ModuleDict({"a": swiglu, "b": added, "c": two_args, "d": dropout})
    skipped = []
    done = ops.patch(model, skipped=skipped)
    assert [r.name for r in done] == ["a", "b.act_fn", "c.act_fn", "d.act_fn"]  # the others keep a SiLU swap only
    assert isinstance(model["a"], GatedMLP) and isinstance(model["b"], _Proj) and isinstance(model["d"], _Proj)
    assert [(n, why) for n, _, why in skipped] == [
        ("b", "its output differs from opsmith's on a random input"),
        ("c", "its forward raised TypeError on a random input of shape (3, 8)")]
    x = torch.randn(5, 8)
    torch.testing.assert_close(model["a"](x), swiglu.down_proj(torch.nn.functional.silu(swiglu.gate_proj(x))
                                                               * swiglu.up_proj(x)))
    assert ops.patch(torch.nn.ModuleDict({"m": _Proj(swiglu._f)}), mlps=False)[0].name == "m.act_fn"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mlp_check_allows_one_rounding_not_another_activation(monkeypatch, dtype):
    """CUDA's silu_mul rounds once (float math), the original's silu then multiply twice: after a
    down projection of 2816 products, outputs near zero differ elementwise by more than the
    elementwise atol (here up to 0.5 of 141, bf16), so an MLP is compared as a whole (L2). The
    float-math product stands in for the CUDA kernel; a GELU where the SiLU was is refused."""
    from opsmith.ops import _patch, _public
    swiglu = _Proj(lambda m, x: m.down_proj(m.act_fn(m.gate_proj(x)) * m.up_proj(x)), width=1024, inner=2816)
    with torch.no_grad():
        for p in swiglu.parameters():
            p.mul_(4)  # larger outputs: the elementwise check fails for bf16
    swiglu = swiglu.to(dtype)
    monkeypatch.setattr(_public, "silu_mul", lambda g, u: (torch.nn.functional.silu(g.float()) * u.float()).to(g.dtype))
    projections = {n: getattr(swiglu, n) for n in ("gate_proj", "up_proj", "down_proj")}
    x = _patch._probe(swiglu, 1024)
    assert _patch._mismatch(swiglu, GatedMLP(projections, "silu"), x) is None
    assert _patch._mismatch(swiglu, GatedMLP(projections, "gelu"), x) == _patch._DIFFERS  # 3 % off
    swapped = {"gate_proj": projections["up_proj"], "up_proj": projections["gate_proj"],
               "down_proj": projections["down_proj"]}
    assert _patch._mismatch(swiglu, GatedMLP(swapped, "silu"), x) == _patch._DIFFERS


def test_gelu_mlps_meta_models_and_compile():
    gelu = _Proj(lambda m, x: m.down_proj(m.act_fn(m.gate_proj(x)) * m.up_proj(x)))
    gelu.act_fn = torch.nn.GELU("tanh")
    (r,) = ops.patch(torch.nn.Sequential(gelu))
    assert (r.new.activation, r.new.approximate) == ("gelu", "tanh") and "approximate='tanh'" in repr(r.new)
    x = torch.randn(4, 8)
    f = torch.compile(r.new, fullgraph=True, dynamic=False)
    torch.testing.assert_close(f(x), gelu(x))
    with torch.device("meta"):  # no data: the structure alone is not trusted
        meta = torch.nn.Sequential(_Proj(gelu._f))
    skipped = []
    assert [r.name for r in ops.patch(meta, skipped=skipped)] == ["0.act_fn"]  # nn.SiLU: known by its type
    assert [n for n, _, _ in skipped] == ["0"]
    with pytest.raises(SpecError, match="GatedMLP takes 2 or 3 projections"):
        GatedMLP({"gate_proj": torch.nn.Linear(2, 2)}, "relu")


def test_known_mlp_class_names_are_trusted_on_meta():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    names = [r.name for r in ops.patch(model)]
    assert "model.layers.0.mlp" in names and not any("act_fn" in n for n in names)


def test_cross_entropy_loss_modules_run_opsmith_and_fall_back_to_torch():
    from opsmith.ops._patch import CrossEntropyLoss

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 13, dtype=torch.float64)
            self.loss = torch.nn.CrossEntropyLoss(ignore_index=3, label_smoothing=0.1)
            self.weighted = torch.nn.CrossEntropyLoss(weight=torch.ones(13))  # class weights: torch's alone

        def forward(self, x, y):
            return self.loss(self.proj(x), y)

    torch.manual_seed(0)
    model = Head()
    x, y = torch.randn(10, 8, dtype=torch.float64), torch.randint(0, 13, (10,))
    y[4] = 3
    want = model(x, y)
    want.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    skipped = []
    done = ops.patch(model, skipped=skipped)
    assert [(r.name, type(r.new)) for r in done] == [("loss", CrossEntropyLoss)] and not skipped
    assert isinstance(model.weighted, torch.nn.CrossEntropyLoss)
    got = model(x, y)
    got.backward()
    torch.testing.assert_close(got, want)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g)
    # inputs opsmith's kernel does not take: torch's cross-entropy, the same answer as the original
    box = torch.nn.ModuleDict({"ce": torch.nn.CrossEntropyLoss(label_smoothing=0.1)})
    orig = box["ce"]
    assert [r.name for r in ops.patch(box)] == ["ce"]
    z, t = torch.randn(2, 13, 5, dtype=torch.float64), torch.randint(0, 13, (2, 5))
    torch.testing.assert_close(box["ce"](z, t), orig(z, t))
    logits, probs = torch.randn(4, 13, dtype=torch.float64), torch.softmax(torch.randn(4, 13, dtype=torch.float64), -1)
    torch.testing.assert_close(box["ce"](logits, probs), orig(logits, probs))
    assert ops.patch(model) == []  # patched already
    assert ops.patch(Head(), losses=False) == []


def _graph_ops(fn, *args) -> set[str]:
    """The call_function targets of the graphs torch.compile (dynamo) traces for ``fn(*args)``."""
    import torch._dynamo
    seen: set[str] = set()

    def backend(gm, example_inputs):
        seen.update(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward
    torch._dynamo.reset()
    try:
        torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)(*args)
    finally:
        torch._dynamo.reset()
    return seen


@pytest.mark.parametrize("under_compile", ["inductor", "opsmith"])
def test_under_compile_picks_torch_ops_for_inductor_or_keeps_opsmiths(under_compile):
    """The default leaves the patched modules' math to inductor while torch.compile traces (so it
    fuses it with its neighbours) and runs opsmith's kernels in eager; "opsmith" keeps opsmith's
    ops in the graph. Both agree with the original model, eager and compiled."""
    model, ref, tokens, labels = _bench_models(1)
    done = ops.patch(model, under_compile=under_compile)
    assert {r.new.inductor for r in done} == {under_compile == "inductor"}
    names = _graph_ops(model, tokens, labels)
    ours = sorted(n for n in names if "opsmith" in n)
    if under_compile == "inductor":
        assert ours == [] and any("rms_norm" in n for n in names) and any("silu" in n for n in names)
    else:
        assert any("rms_norm" in n for n in ours) and any("silu" in n for n in ours), ours
        assert any("rotary_embedding" in n for n in ours), ours
    want = ref(tokens, labels)
    torch.testing.assert_close(model(tokens, labels), want)  # eager: opsmith's kernels either way
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(model, backend="aot_eager", dynamic=False)(tokens, labels), want)
    torch._dynamo.reset()
    with pytest.raises(SpecError, match="under_compile is 'inductor'"):
        ops.patch(torch.nn.Sequential(torch.nn.ReLU()), under_compile="yes")
