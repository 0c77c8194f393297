"""opsmith.ops.patch on CPU: torch's own modules, tiny random-initialised Hugging Face models of
the Llama, Mistral, Qwen2/3 and Gemma families (no weights downloaded), a module that only looks
like an RMS norm, meta models, idempotence."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from opsmith import ops  # noqa: E402
from opsmith.ops import _modules  # noqa: E402


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
    # family: (config class, extra config, RMS norm class)
    "llama": ("LlamaConfig", {}, "LlamaRMSNorm"),
    "mistral": ("MistralConfig", {}, "MistralRMSNorm"),
    "qwen2": ("Qwen2Config", {}, "Qwen2RMSNorm"),
    "qwen3": ("Qwen3Config", {"head_dim": 16}, "Qwen3RMSNorm"),
    "gemma": ("GemmaConfig", {"head_dim": 16}, "GemmaRMSNorm"),
    "gemma2": ("Gemma2Config", {"head_dim": 16}, "Gemma2RMSNorm"),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tiny_transformers_models_keep_their_outputs(family):
    transformers = pytest.importorskip("transformers")
    cfg_name, extra, norm_name = FAMILIES[family]
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
    with torch.no_grad():
        want = model(ids).logits
    norms_before = sum(type(m).__name__ == norm_name for m in model.modules())
    done = ops.patch(model)
    kinds = {type(r.old).__name__ for r in done}
    assert norm_name in kinds and sum(type(r.old).__name__ == norm_name for r in done) == norms_before
    assert not any(type(m).__name__ == norm_name for m in model.modules())
    assert any("mlp.act_fn" in r.name for r in done), [r.name for r in done]
    with torch.no_grad():
        got = model(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert ops.patch(model) == []
