"""RoPE tables equal transformers' own rope init functions for every supported scaling."""

from __future__ import annotations

import pytest
import torch
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.model.rope import RotaryEmbedding

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

HEAD_DIM, MAX_POS, THETA = 32, 128, 10000.0
SCALINGS = {
    "linear": dict(rope_type="linear", factor=4.0),
    "dynamic": dict(rope_type="dynamic", factor=2.0),
    "llama3": dict(
        rope_type="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=64,
    ),
    "yarn": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32),
    "yarn-mscale": dict(
        rope_type="yarn",
        factor=4.0,
        original_max_position_embeddings=32,
        mscale=1.0,
        mscale_all_dim=0.5,
        beta_fast=16,
        beta_slow=2,
    ),  # fmt: skip
}


def _hf_config(scaling: dict) -> object:
    return transformers.LlamaConfig(
        hidden_size=HEAD_DIM * 2,
        num_attention_heads=2,
        max_position_embeddings=MAX_POS,
        rope_parameters=dict(scaling, rope_theta=THETA),
    )


@pytest.mark.parametrize("kind", ["linear", "llama3", "yarn", "yarn-mscale"])
def test_static_scalings_equal_transformers(kind):
    scaling = SCALINGS[kind]
    want_inv, want_att = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](_hf_config(scaling), "cpu")
    rope = RotaryEmbedding(HEAD_DIM, THETA, MAX_POS, dict(scaling))
    torch.testing.assert_close(rope.inv_freq, want_inv, rtol=1e-6, atol=0)
    assert rope.attention_scaling == pytest.approx(want_att)
    pos = torch.tensor([0, 5, 127])
    cos, sin = rope.cos_sin(pos, 127)
    angles = pos[:, None].float() * want_inv[None, :]
    torch.testing.assert_close(cos, angles.cos() * want_att)
    torch.testing.assert_close(sin, angles.sin() * want_att)


def test_dynamic_ntk_matches_transformers_at_each_length():
    """Position p rotates as HF does for a sequence of length p + 1 (unscaled inside max)."""
    scaling = SCALINGS["dynamic"]
    cfg = _hf_config(scaling)
    rope = RotaryEmbedding(HEAD_DIM, THETA, MAX_POS, dict(scaling), initial_positions=16)
    for p in (3, MAX_POS - 1, MAX_POS, 300):
        inv, _ = ROPE_INIT_FUNCTIONS["dynamic"](cfg, "cpu", seq_len=p + 1)
        cos, sin = rope.cos_sin(torch.tensor([p]), p)  # past the first 16: the table grows
        torch.testing.assert_close(cos[0], (p * inv).cos(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(sin[0], (p * inv).sin(), rtol=1e-5, atol=1e-5)
    assert rope.cos.shape[0] >= 301


def test_rotation_preserves_norm_and_relative_angle():
    rope = RotaryEmbedding(HEAD_DIM, THETA, MAX_POS)
    q, k = torch.randn(1, 1, HEAD_DIM), torch.randn(1, 1, HEAD_DIM)

    def dot(pq: int, pk: int) -> float:
        cq, sq = rope.cos_sin(torch.tensor([pq]), pq)
        ck, sk = rope.cos_sin(torch.tensor([pk]), pk)
        return float((RotaryEmbedding.apply(q, cq, sq) * RotaryEmbedding.apply(k, ck, sk)).sum())

    c, s = rope.cos_sin(torch.tensor([9]), 9)
    assert RotaryEmbedding.apply(q, c, s).norm() == pytest.approx(float(q.norm()), rel=1e-5)
    assert dot(10, 4) == pytest.approx(dot(36, 30), rel=1e-4, abs=1e-5)


def test_unknown_rope_type_is_an_engine_error():
    with pytest.raises(EngineError, match="rope_type 'longrope' is not supported"):
        RotaryEmbedding(HEAD_DIM, THETA, MAX_POS, {"rope_type": "longrope", "factor": 2.0})
