"""The reference model equals Hugging Face transformers: greedy tokens from ModelRunner
(prefill + decode over the paged cache) match `generate(do_sample=False)` on random tiny
checkpoints written by transformers itself."""

from __future__ import annotations

import pytest
import torch
from cbbench.kernels import torch_split_kv
from cbbench.reference_engine.execution.model_runner import ModelRunner
from cbbench.reference_engine.model.loader import load_model
from engine_model_support import (
    HF_TINY_SHAPE,
    generate,
    hf_greedy,
    make_seq,
    paged_logits,
    save_hf_model,
)

transformers = pytest.importorskip("transformers")

PROMPTS = [
    [5, 17, 300, 42, 7, 99, 12],
    [250],
    [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4],
    [77, 66],
]
MAX_TOKENS = 12


def _ours(path: str, prompts, max_tokens: int, token_budget: int | None = None, block_size=4):
    runner = ModelRunner(path, num_kv_blocks=64, block_size=block_size)
    seqs = [make_seq(str(i), p, max_tokens) for i, p in enumerate(prompts)]
    return generate(runner, seqs, token_budget=token_budget)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> str:
    cfg = transformers.LlamaConfig(**HF_TINY_SHAPE, rope_theta=10000.0)
    return save_hf_model(tmp_path_factory, "llama", cfg)


@pytest.fixture(scope="module")
def llama_expected(llama_dir) -> list[list[int]]:
    return hf_greedy(llama_dir, PROMPTS, MAX_TOKENS)


def test_llama_greedy_equals_transformers(llama_dir, llama_expected):
    assert _ours(llama_dir, PROMPTS, MAX_TOKENS) == llama_expected
    # not a degenerate model: sequences differ and tokens vary within one
    assert len({tuple(t) for t in llama_expected}) == len(PROMPTS)
    assert all(len(set(t)) > 2 for t in llama_expected)


def test_llama_chunked_prefill_equals_transformers(llama_dir, llama_expected):
    # a budget of 5 tokens per step splits prompts into chunks mixed with other decodes
    assert _ours(llama_dir, PROMPTS, MAX_TOKENS, token_budget=5, block_size=2) == llama_expected


def test_llama_greedy_with_in_place_split_kv_equals_transformers(
    llama_dir, llama_expected, monkeypatch
):
    """Blocks handed out in order make prompt runs: the torch backend reads them in place
    (threshold lowered to this tiny model) and still decodes what transformers decodes."""
    calls = []
    real = torch_split_kv.split_kv_decode
    monkeypatch.setattr(
        torch_split_kv, "split_kv_decode", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    runner = ModelRunner(llama_dir, num_kv_blocks=64, block_size=2)
    assert runner.backend.name == "torch"
    runner.backend.paged_kernel = False  # the torch path, not the C++ decode kernel
    runner.backend.split_kv_min_run_bytes = 0
    seqs = [make_seq(str(i), p, MAX_TOKENS) for i, p in enumerate(PROMPTS)]
    assert generate(runner, seqs, shuffle_pool=False) == llama_expected
    assert calls  # the in-place path ran


def test_logits_match_transformers(llama_dir):
    """Beyond argmax: the prompt's last-position logits agree to fp32 rounding."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).eval()
    prompt = PROMPTS[2]
    with torch.no_grad():
        want = hf(torch.tensor([prompt])).logits[0, -1:]
    got = paged_logits(load_model(llama_dir), prompt, block_size=8)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "kind",
    ["qwen2", "mistral", "llama3-rope", "linear-rope", "yarn-rope", "tied"],
)
def test_other_architectures_equal_transformers(tmp_path_factory, kind):
    shape = dict(HF_TINY_SHAPE)
    if kind == "qwen2":  # q/k/v biases, no GQA head-dim quirks
        cfg = transformers.Qwen2Config(**shape)
    elif kind == "mistral":
        cfg = transformers.MistralConfig(**shape, sliding_window=None)
    else:
        scaling = {
            "llama3-rope": dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=32,
            ),
            "linear-rope": dict(rope_type="linear", factor=4.0),
            "yarn-rope": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64),
            "tied": None,
        }[kind]
        extra = {"tie_word_embeddings": True} if kind == "tied" else {}
        params = dict(scaling or {"rope_type": "default"}, rope_theta=500.0)
        cfg = transformers.LlamaConfig(**shape, rope_parameters=params, **extra)
    path = save_hf_model(tmp_path_factory, kind, cfg)
    if kind == "qwen2":
        loaded = load_model(path)
        assert loaded.config.attention_bias
        assert loaded.model.layers[0].self_attn.qkv_proj.bias.abs().sum() > 0
    assert _ours(path, PROMPTS, 8) == hf_greedy(path, PROMPTS, 8)
