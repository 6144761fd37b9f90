"""The mixture-of-experts side of the model config: reading Mixtral's and Qwen2-MoE's fields
from an HF config.json under the engine's names (config.py's ModelConfig holds them), and the
MoE presets (random weights: tiny-moe, small-moe; real shapes for the simulator).
"""

from __future__ import annotations

from typing import Any

from cbbench.reference_engine.errors import EngineError

MOE_ARCHITECTURES = ("MixtralForCausalLM", "Qwen2MoeForCausalLM")

MOE_FIELDS = (
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "norm_topk_prob",
    "decoder_sparse_step",
    "mlp_only_layers",
)


def moe_fields(arch: str, cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """The MoE fields of an HF config under the engine's names ({} for a dense model)."""
    if arch not in MOE_ARCHITECTURES:
        return {}
    if arch == "MixtralForCausalLM":
        if "num_local_experts" not in cfg:
            raise EngineError(f"{where}: missing num_local_experts")
        return dict(
            num_experts=int(cfg["num_local_experts"]),
            num_experts_per_tok=int(cfg.get("num_experts_per_tok", 2)),
            moe_intermediate_size=int(cfg["intermediate_size"]),
        )
    missing = [k for k in ("num_experts", "moe_intermediate_size") if k not in cfg]
    if missing:
        raise EngineError(f"{where}: missing {', '.join(missing)}")
    return dict(
        num_experts=int(cfg["num_experts"]),
        num_experts_per_tok=int(cfg.get("num_experts_per_tok", 4)),
        moe_intermediate_size=int(cfg["moe_intermediate_size"]),
        shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        decoder_sparse_step=int(cfg.get("decoder_sparse_step", 1)),
        mlp_only_layers=tuple(int(x) for x in cfg.get("mlp_only_layers") or ()),
    )


# Mixture of experts: random-weight presets for CPU tests and serving, and real shapes for
# the simulator (docs/moe.md).
MOE_PRESETS: dict[str, dict[str, Any]] = {
    "tiny-moe": dict(
        architecture="MixtralForCausalLM",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        num_experts=8,
        num_experts_per_tok=2,
    ),
    # Qwen2-MoE's layout (a shared expert with its sigmoid gate, 16 experts, top-4): ~37M
    # parameters, ~23M active per token
    "small-moe": dict(
        architecture="Qwen2MoeForCausalLM",
        vocab_size=32000,
        hidden_size=384,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        attention_bias=True,
        num_experts=16,
        num_experts_per_tok=4,
        moe_intermediate_size=256,
        shared_expert_intermediate_size=1024,
        norm_topk_prob=False,
        rms_norm_eps=1e-6,
    ),
    "mixtral-8x7b": dict(
        architecture="MixtralForCausalLM",
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        num_experts=8,
        num_experts_per_tok=2,
        torch_dtype="bfloat16",
    ),
    "qwen1.5-moe-a2.7b": dict(
        architecture="Qwen2MoeForCausalLM",
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=16,
        max_position_embeddings=8192,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        attention_bias=True,
        num_experts=60,
        num_experts_per_tok=4,
        moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632,
        norm_topk_prob=False,
        bos_token_id=151643,
        eos_token_id=151643,
        torch_dtype="bfloat16",
    ),
}
