"""Our decoder against transformers' on the same weights, and the HF-layout round trip."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from turbo_dllm.errors import DllmError
from turbo_dllm.families.decoder.runtime import build_model
from turbo_dllm.registry import get_family
from turbo_dllm.train.attention import BlockDiffusionLayout, ReferenceAttention, dense_mask
from turbo_dllm.train.weights import full_state_dict, materialize, save_hf

transformers = pytest.importorskip("transformers")


def causal(q, k, v, mask):
    return F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1]
    )


def _hf_model(model_type: str, **extra):
    common = dict(
        vocab_size=97,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
    )
    common.update(extra)
    torch.manual_seed(0)
    if model_type == "qwen3":
        config = transformers.Qwen3Config(head_dim=16, **common)
        model = transformers.Qwen3ForCausalLM(config)
    elif model_type == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    with torch.no_grad():  # non-trivial norms and biases, so a wrong mapping shows up
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("bias"):
                param.add_(0.1 * torch.randn_like(param))
    return model.eval()


def _ours(folder, backend=causal):
    config = get_family("causal_lm").resolve_config(path=str(folder), from_config=None)
    model = build_model(config, backend)
    return materialize(model, torch.device("cpu"), seed=0, weights_from=str(folder)).eval()


@pytest.mark.parametrize(
    "model_type,extra",
    [
        ("qwen3", {}),
        ("qwen3", {"tie_word_embeddings": True}),
        ("qwen2", {}),
        ("llama", {"attention_bias": True, "mlp_bias": True}),
        # hidden_act is honoured, not rewritten to silu (a gelu config trained silently wrong).
        ("llama", {"hidden_act": "gelu"}),
        ("qwen3", {"hidden_act": "gelu_pytorch_tanh"}),
        ("qwen2", {"hidden_act": "relu"}),
        (
            "llama",
            {
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 16,
                }
            },
        ),
    ],
)
def test_causal_forward_matches_transformers(tmp_path, model_type, extra):
    hf = _hf_model(model_type, **extra)
    hf.save_pretrained(tmp_path)
    ours = _ours(tmp_path)
    ids = torch.randint(0, 97, (2, 40))
    with torch.no_grad():
        expected = hf(input_ids=ids).logits
        got = ours(ids, torch.arange(40))
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_block_diffusion_forward_matches_transformers_with_dense_mask(tmp_path):
    """Our model + reference backend == HF Qwen3 given the same 2L x 2L boolean mask."""
    hf = _hf_model("qwen3")
    hf.save_pretrained(tmp_path)
    ours = _ours(tmp_path, backend=ReferenceAttention())
    layout = BlockDiffusionLayout(seq_len=24, block_size=4)
    docs = torch.tensor([[0] * 10 + [1] * 14, [0] * 24])
    ids = torch.randint(0, 97, (2, 48))
    positions = layout.positions()
    mask = dense_mask(layout, docs)
    with torch.no_grad():
        got = ours(ids, positions, mask)
        expected = hf(
            input_ids=ids, attention_mask=mask, position_ids=positions.expand(2, -1)
        ).logits
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_saved_folder_loads_in_transformers_with_same_logits(tmp_path):
    config = get_family("causal_lm").resolve_config(
        path=None, from_config="tiny", overrides={"num_hidden_layers": 2}
    )
    model = materialize(build_model(config, causal), torch.device("cpu"), seed=3).eval()
    save_hf(full_state_dict(model), config, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["tie_word_embeddings"] is True
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, config.vocab_size, (1, 32))
    with torch.no_grad():
        torch.testing.assert_close(
            model(ids, torch.arange(32)), hf(input_ids=ids).logits, atol=2e-5, rtol=1e-4
        )


def test_random_init_is_deterministic_and_seeded():
    config = get_family("causal_lm").resolve_config(path=None, from_config="tiny")
    a = materialize(build_model(config, causal), torch.device("cpu"), seed=1)
    b = materialize(build_model(config, causal), torch.device("cpu"), seed=1)
    c = materialize(build_model(config, causal), torch.device("cpu"), seed=2)
    assert a.lm_head.weight is a.model.embed_tokens.weight
    for (name, pa), pb, pc in zip(
        a.named_parameters(), b.parameters(), c.parameters(), strict=True
    ):
        assert torch.equal(pa, pb), name
        if pa.dim() > 1:
            assert not torch.equal(pa, pc), name
    assert sum(p.numel() for p in a.parameters()) == config.num_params()


def test_presets_have_real_qwen3_shapes():
    config = get_family("causal_lm").resolve_config(path=None, from_config="qwen3-1.7b")
    assert 1.6e9 < config.num_params() < 2.2e9
    assert config.qk_norm and config.tie_word_embeddings and config.head_dim == 128
    overridden = get_family("causal_lm").resolve_config(
        path=None, from_config="qwen3-1.7b", overrides={"num_hidden_layers": 2}
    )
    assert overridden.num_hidden_layers == 2


def test_bad_configs_are_user_errors(tmp_path):
    with pytest.raises(DllmError, match="unknown model preset"):
        get_family("causal_lm").resolve_config(path=None, from_config="gpt5")
    with pytest.raises(DllmError, match="config not found"):
        get_family("causal_lm").resolve_config(path=str(tmp_path), from_config=None)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 3}))
    with pytest.raises(DllmError, match="'gpt2' model, which model.family 'causal_lm' does not"):
        get_family("causal_lm").resolve_config(path=str(tmp_path), from_config=None)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 3}))
    with pytest.raises(DllmError, match="lacks the field"):
        get_family("causal_lm").resolve_config(path=str(tmp_path), from_config=None)
    with pytest.raises(DllmError, match="multiple of num_key_value_heads"):
        get_family("causal_lm").resolve_config(
            path=None, from_config="tiny", overrides={"num_key_value_heads": 3}
        )


def test_missing_weights_name_the_tensor(tmp_path):
    hf = _hf_model("qwen3")
    hf.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(DllmError, match=r"model\.layers\.2\."):
        _ours(tmp_path)


@pytest.mark.parametrize(
    "x_dtype, w_dtype",
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.bfloat16, torch.float32),
    ],
)
def test_rmsnorm_matches_the_eager_formula_and_saves_only_its_input(x_dtype, w_dtype):
    """transformers' RMSNorm math, forward and backward, without keeping float32 copies."""

    from turbo_dllm.families.decoder.model import RMSNorm

    torch.manual_seed(0)
    norm = RMSNorm(64, eps=1e-6).to(w_dtype)
    with torch.no_grad():
        norm.weight.add_(0.1 * torch.randn(64, dtype=w_dtype))
    x = torch.randn(3, 5, 64, dtype=x_dtype, requires_grad=True)
    out = norm(x)
    want = norm.weight * F.rms_norm(x.float(), (64,), eps=1e-6).to(x_dtype)
    assert out.dtype == want.dtype
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
    saved = out.grad_fn.saved_tensors
    assert saved[0].data_ptr() == x.data_ptr()  # the input itself, not a float32 copy
    assert [t.shape for t in saved[1:]] == [norm.weight.shape, (3, 5, 1)]
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (x, norm.weight), grad)
    expected = torch.autograd.grad(want, (x, norm.weight), grad)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_gradients_are_the_eager_graphs_without_keeping_silu(dtype):
    from turbo_dllm.families.decoder.model import _SwiGLU

    torch.manual_seed(0)
    gate = torch.randn(4, 7, 32, dtype=dtype, requires_grad=True)
    up = torch.randn(4, 7, 32, dtype=dtype, requires_grad=True)
    out = _SwiGLU.apply(gate, up)
    want = F.silu(gate) * up
    assert torch.equal(out, want)
    assert [t.data_ptr() for t in out.grad_fn.saved_tensors] == [gate.data_ptr(), up.data_ptr()]
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (gate, up), grad)
    expected = torch.autograd.grad(want, (gate, up), grad)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)


def test_chunked_mlp_equals_the_whole_one_and_keeps_less_for_the_backward():
    """mlp.chunks > 1: same output and gradients; intermediates are recomputed per chunk."""
    from turbo_dllm.families.decoder.model import MLP

    config = get_family("causal_lm").resolve_config(path=None, from_config="tiny")
    torch.manual_seed(0)
    whole = MLP(config)
    chunked = MLP(config)
    chunked.load_state_dict(whole.state_dict())
    chunked.chunks = 3
    x = torch.randn(2, 10, config.hidden_size, requires_grad=True)
    grad = torch.randn(2, 10, config.hidden_size)
    outs, grads = [], []
    for mlp in (whole, chunked):
        out = mlp(x)
        outs.append(out)
        grads.append(torch.autograd.grad(out, (x, *mlp.parameters()), grad))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-6, atol=1e-6)
    for a, b in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

    def saved_bytes(mlp):
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(
            lambda t: sizes.append(t.numel() * t.element_size()) or t, lambda t: t
        ):
            mlp(x)
        return sum(sizes)

    # The whole MLP saves its intermediate-sized activations; the chunked one only its inputs.
    assert saved_bytes(chunked) < saved_bytes(whole) / 3
    with torch.no_grad():  # no autograd: no checkpointing, plain forward
        torch.testing.assert_close(chunked(x), whole(x), rtol=1e-6, atol=1e-6)


def test_hidden_act_round_trips_and_unknown_is_refused(tmp_path):
    _hf_model("llama", hidden_act="gelu").save_pretrained(tmp_path)
    config = get_family("causal_lm").resolve_config(path=str(tmp_path), from_config=None)
    assert config.to_hf_dict()["hidden_act"] == "gelu"  # export writes what it read
    with pytest.raises(DllmError, match="hidden_act 'swish_beta' is not supported"):
        get_family("causal_lm").resolve_config(
            path=None, from_config="tiny", overrides={"hidden_act": "swish_beta"}
        )
