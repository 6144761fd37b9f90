"""Mixture-of-experts models equal Hugging Face transformers: Mixtral and Qwen2-MoE checkpoints
written by transformers load through our loader and decode the same greedy tokens through
ModelRunner (prefill + paged decode), and our random presets saved as HF folders decode in
transformers what they decode here. The grouped expert computation equals a per-token
reference, and the expert-load counters count every routed (token, expert) pair."""

from __future__ import annotations

import json

import pytest
import torch
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.model_runner import ModelRunner
from cbbench.reference_engine.model.config import ModelConfig, preset_config
from cbbench.reference_engine.model.loader import load_model, random_model, save_random_model
from cbbench.reference_engine.model.mixtral import MoeForCausalLM
from cbbench.reference_engine.model.moe import SparseMoeBlock
from engine_model_support import HF_TINY_SHAPE, generate, hf_greedy, make_seq

transformers = pytest.importorskip("transformers")

PROMPTS = [
    [5, 17, 300, 42, 7, 99, 12],
    [250],
    [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4],
    [77, 66],
]
MAX_TOKENS = 10


def _ours(path: str, prompts, max_tokens: int, token_budget: int | None = None, block_size=4):
    runner = ModelRunner(path, num_kv_blocks=64, block_size=block_size)
    seqs = [make_seq(str(i), p, max_tokens) for i, p in enumerate(prompts)]
    return generate(runner, seqs, token_budget=token_budget), runner


def _save_hf(tmp_path_factory, name: str, model) -> str:
    path = tmp_path_factory.mktemp(name)
    model.eval().save_pretrained(path, safe_serialization=True)
    return str(path)


@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory) -> str:
    torch.manual_seed(1234)
    cfg = transformers.MixtralConfig(
        **dict(HF_TINY_SHAPE, intermediate_size=48), num_local_experts=8, num_experts_per_tok=2
    )
    model = transformers.MixtralForCausalLM(cfg)
    with torch.no_grad():  # a sharper router than the 0.02 init: tokens disagree on experts
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 0.5)
    return _save_hf(tmp_path_factory, "mixtral", model)


@pytest.fixture(scope="module")
def qwen_moe_dir(tmp_path_factory) -> str:
    torch.manual_seed(4321)
    cfg = transformers.Qwen2MoeConfig(
        **HF_TINY_SHAPE,
        num_experts=6,
        num_experts_per_tok=3,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=40,
        norm_topk_prob=False,
        mlp_only_layers=[1],  # layer 1 dense: both kinds of layer in one model
    )
    model = transformers.Qwen2MoeForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.2)
            if name.endswith(("mlp.gate.weight", "shared_expert_gate.weight")):
                p.normal_(0.0, 0.5)
    return _save_hf(tmp_path_factory, "qwen2moe", model)


def test_mixtral_greedy_equals_transformers(mixtral_dir):
    expected = hf_greedy(mixtral_dir, PROMPTS, MAX_TOKENS)
    got, runner = _ours(mixtral_dir, PROMPTS, MAX_TOKENS)
    assert got == expected
    assert len({tuple(t) for t in expected}) == len(PROMPTS)
    assert isinstance(runner.model, MoeForCausalLM)
    load = runner.model.expert_load()
    assert load.shape == (2, 8)
    # every token of every forward routed to 2 experts in each of the 2 layers
    tokens = sum(len(p) + MAX_TOKENS - 1 for p in PROMPTS)
    assert load.sum(dim=1).tolist() == [2 * tokens, 2 * tokens]
    assert (load > 0).sum() > 8  # the sharpened router spreads tokens over several experts
    # chunked prefill mixed with decodes (5 tokens a step) decodes the same
    assert _ours(mixtral_dir, PROMPTS, MAX_TOKENS, token_budget=5, block_size=2)[0] == expected


def test_qwen2_moe_greedy_equals_transformers(qwen_moe_dir):
    loaded = load_model(qwen_moe_dir)
    cfg = loaded.config
    assert cfg.architecture == "Qwen2MoeForCausalLM" and cfg.sparse_layers == [0]
    assert cfg.attention_bias and not cfg.norm_topk_prob
    assert isinstance(loaded.model.layers[0].mlp, SparseMoeBlock)
    assert not isinstance(loaded.model.layers[1].mlp, SparseMoeBlock)
    assert loaded.model.layers[0].mlp.shared_expert is not None
    expected = hf_greedy(qwen_moe_dir, PROMPTS, MAX_TOKENS)
    assert _ours(qwen_moe_dir, PROMPTS, MAX_TOKENS)[0] == expected
    assert len({tuple(t) for t in expected}) == len(PROMPTS)


@pytest.mark.parametrize("preset", ["tiny-moe", "small-moe"])
def test_presets_saved_and_loaded_decode_as_transformers(tmp_path, preset):
    """Our random preset, saved as an HF folder, loads in transformers (its own config
    class, from our config.json) and in our loader; both decode the same."""
    path = save_random_model(preset, tmp_path / preset, seed=3)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == [preset_config(preset).architecture]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert type(hf).__name__ == preset_config(preset).architecture
    prompts = [p for p in PROMPTS if len(p) > 1]
    assert _ours(str(path), prompts, 6)[0] == hf_greedy(str(path), prompts, 6)


def test_grouped_experts_equal_a_per_token_reference():
    cfg = preset_config("tiny-moe")
    block = random_model(cfg, seed=5).model.layers[0].mlp
    assert isinstance(block, SparseMoeBlock)
    with torch.no_grad():
        block.gate.weight.normal_(0.0, 1.0)
        x = torch.randn(37, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
        got = block(x)
        weights, ids = block.route(x)
        want = torch.zeros_like(x)
        ex = block.experts
        for t in range(x.shape[0]):  # the definition, one token at a time
            for w, e in zip(weights[t].tolist(), ids[t].tolist(), strict=True):
                gate, up = (ex.w13[e] @ x[t]).split(ex.intermediate_size)
                want[t] += w * (ex.w2[e] @ (torch.nn.functional.silu(gate) * up))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    weights_sum = weights.sum(-1)
    torch.testing.assert_close(weights_sum, torch.ones_like(weights_sum))  # renormalised
    assert block.expert_load.tolist() == torch.bincount(ids.reshape(-1), minlength=8).tolist()


def test_routing_histograms_per_row():
    model = random_model("tiny-moe", seed=1)
    model.set_record_routing(True)
    from engine_model_support import paged_logits

    paged_logits(model, [5, 6, 7, 8, 9, 10], block_size=4)
    rows = torch.tensor([0, 0, 1, 1, 1, 2])
    hist = model.routing_histograms(rows, 3)
    assert hist.shape == (3, 8)
    k, layers = 2, 2
    assert hist.sum(dim=1).tolist() == [2 * k * layers, 3 * k * layers, 1 * k * layers]
    assert hist.sum(dim=0).tolist() == model.expert_load().sum(dim=0).tolist()


def test_bad_moe_configs_name_the_field(tmp_path):
    base = dict(
        architectures=["MixtralForCausalLM"], vocab_size=64, hidden_size=16,
        intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
    )  # fmt: skip
    with pytest.raises(EngineError, match="missing num_local_experts"):
        ModelConfig.from_hf_dict(base)
    with pytest.raises(EngineError, match="num_experts_per_tok"):
        ModelConfig.from_hf_dict(dict(base, num_local_experts=4, num_experts_per_tok=5))
    qwen = dict(base, architectures=["Qwen2MoeForCausalLM"], num_experts=4)
    with pytest.raises(EngineError, match="missing moe_intermediate_size"):
        ModelConfig.from_hf_dict(qwen)


def test_broken_moe_checkpoints_name_the_tensor(tmp_path):
    from safetensors.torch import load_file, save_file

    path = save_random_model("tiny-moe", tmp_path / "m", seed=0)
    weights = load_file(path / "model.safetensors")
    name = "model.layers.1.block_sparse_moe.experts.7.w3.weight"
    save_file({k: v for k, v in weights.items() if k != name}, path / "model.safetensors")
    with pytest.raises(EngineError, match=r"experts\.7\.w3\.weight.* missing"):
        load_model(path)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(cfg, num_local_experts=4)))
    save_file(weights, path / "model.safetensors")
    with pytest.raises(EngineError, match=r"unexpected tensor .*experts\.4\."):
        load_model(path)
