"""Model architecture from an HF `config.json`, and named shapes for random-weight models.

One dataclass serves the real model (reference_engine/model/llama.py), the loader and the
simulator's cost model, so they always agree on the shape.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.model.moe_config import (
    MOE_ARCHITECTURES,
    MOE_FIELDS,
    MOE_PRESETS,
    moe_fields,
)

DENSE_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
SUPPORTED_ARCHITECTURES = DENSE_ARCHITECTURES + MOE_ARCHITECTURES
MODEL_TYPES = {
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
}


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    head_dim: int | None = None  # defaults to hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # HF format: rope_type linear|dynamic|llama3|yarn
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 uses q/k/v biases
    architecture: str = "LlamaForCausalLM"
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    torch_dtype: str = "float32"
    # mixture of experts (Mixtral, Qwen2-MoE); num_experts 0 = a dense model
    num_experts: int = 0  # HF: num_local_experts (Mixtral), num_experts (Qwen2-MoE)
    num_experts_per_tok: int = 0  # top-k
    moe_intermediate_size: int | None = None  # one expert's; Mixtral: intermediate_size
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's shared expert (0: none)
    norm_topk_prob: bool = True  # renormalise the top-k router probabilities
    decoder_sparse_step: int = 1  # every n-th layer is sparse (Qwen2-MoE)
    mlp_only_layers: tuple[int, ...] = ()  # dense layers among them (Qwen2-MoE)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise EngineError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        self.mlp_only_layers = tuple(self.mlp_only_layers)
        if self.num_experts:
            if self.moe_intermediate_size is None:
                self.moe_intermediate_size = self.intermediate_size
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise EngineError(
                    f"num_experts_per_tok ({self.num_experts_per_tok}) must be in 1.."
                    f"{self.num_experts} (num_experts)"
                )
            if self.decoder_sparse_step < 1:
                raise EngineError(
                    f"decoder_sparse_step must be >= 1, got {self.decoder_sparse_step}"
                )

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_sparse_layer(self, i: int) -> bool:
        """Whether decoder layer `i` has a routed-experts block (else a dense MLP)."""
        return (
            self.num_experts > 0
            and i not in self.mlp_only_layers
            and (i + 1) % self.decoder_sparse_step == 0
        )

    @property
    def sparse_layers(self) -> list[int]:
        return [i for i in range(self.num_hidden_layers) if self.is_sparse_layer(i)]

    def mlp_params(self, i: int, active: bool = False) -> int:
        """Parameters of layer `i`'s MLP; `active`: those one token uses (its top-k experts)."""
        h = self.hidden_size
        if not self.is_sparse_layer(i):
            return 3 * h * self.intermediate_size
        assert self.moe_intermediate_size is not None
        experts = self.num_experts_per_tok if active else self.num_experts
        shared = 3 * h * self.shared_expert_intermediate_size
        shared += h if self.shared_expert_intermediate_size else 0  # its sigmoid gate
        return experts * 3 * h * self.moe_intermediate_size + h * self.num_experts + shared

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        if self.eos_token_id is None:
            return ()
        if isinstance(self.eos_token_id, int):
            return (self.eos_token_id,)
        return tuple(self.eos_token_id)

    def num_params(self, active: bool = False) -> int:
        """All parameters; `active`: those one token's forward uses (MoE: top-k experts)."""
        h, L = self.hidden_size, self.num_hidden_layers
        d = self.head_dim or h // self.num_attention_heads
        q = h * self.num_attention_heads * d
        kv = 2 * h * self.num_key_value_heads * d
        o = self.num_attention_heads * d * h
        mlp = sum(self.mlp_params(i, active) for i in range(L))
        emb = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return L * (q + kv + o + 2 * h) + mlp + emb + head + h

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        assert self.head_dim is not None
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes

    # --- HF config.json ---------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any], where: str = "config.json",
                     shape_only: bool = False) -> ModelConfig:  # fmt: skip
        """`shape_only` (the simulator): a dense architecture the engine cannot run (Qwen3,
        Gemma, ...) is read for its shape alone, as a Llama of the same sizes."""
        archs = cfg.get("architectures") or ["LlamaForCausalLM"]
        arch = archs[0]
        if shape_only and arch not in SUPPORTED_ARCHITECTURES and not cfg.get("num_experts") \
                and not cfg.get("num_local_experts"):  # fmt: skip
            cfg = {k: v for k, v in cfg.items() if k not in ("hidden_act", "mlp_bias")}
            arch = "LlamaForCausalLM"
        if arch not in SUPPORTED_ARCHITECTURES:
            raise EngineError(
                f"{where}: architecture {arch!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        required = (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
        )
        missing = [k for k in required if k not in cfg]
        if missing:
            raise EngineError(f"{where}: missing {', '.join(missing)}")
        if cfg.get("hidden_act", "silu") != "silu" or cfg.get("mlp_bias"):
            raise EngineError(f"{where}: only SiLU MLPs without bias are supported")
        # transformers >= 5 writes `rope_parameters` (rope_theta inside); older, rope_scaling
        rope_params = dict(cfg.get("rope_parameters") or {})
        rope_theta = cfg.get("rope_theta", rope_params.pop("rope_theta", 10000.0))
        rope_scaling = cfg.get("rope_scaling")
        if rope_scaling is None and rope_params.get("rope_type", "default") != "default":
            rope_scaling = rope_params
        moe = moe_fields(arch, cfg, where)
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=int(cfg["num_attention_heads"]),
            num_key_value_heads=int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            head_dim=cfg.get("head_dim"),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(
                cfg.get("attention_bias", cfg.get("qkv_bias", arch.startswith("Qwen2")))
            ),
            architecture=arch,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=cfg.get("eos_token_id"),
            torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"),
            **moe,
        )

    @classmethod
    def from_file(cls, path: str | Path, shape_only: bool = False) -> ModelConfig:
        p = Path(path)
        try:
            cfg = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise EngineError(f"{p}: no such file") from None
        except json.JSONDecodeError as exc:
            raise EngineError(f"{p}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        return cls.from_hf_dict(cfg, where=str(p), shape_only=shape_only)

    def to_hf_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra")
        arch = d.pop("architecture")
        moe = {k: d.pop(k) for k in MOE_FIELDS}
        if arch == "MixtralForCausalLM":
            d.update(
                num_local_experts=moe["num_experts"],
                num_experts_per_tok=moe["num_experts_per_tok"],
                intermediate_size=moe["moe_intermediate_size"],
            )
        elif arch == "Qwen2MoeForCausalLM":
            moe["mlp_only_layers"] = list(moe["mlp_only_layers"])
            d.update(moe, qkv_bias=d["attention_bias"])
        return {"architectures": [arch], "model_type": MODEL_TYPES.get(arch, "llama"), **d}


# Named shapes. `tiny` is for CPU tests and the default run; the others are real models'
# shapes for GPU runs and the simulator (weights random unless a checkpoint is given).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
    ),
    # ~54M parameters: the CPU engine-comparison model
    "small": dict(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=9,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    ),
    "qwen2.5-0.5b": dict(
        architecture="Qwen2ForCausalLM",
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        attention_bias=True,
        bos_token_id=151643,
        eos_token_id=151645,
        torch_dtype="bfloat16",
    ),
    "llama-3-8b": dict(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        bos_token_id=128000,
        eos_token_id=128001,
        torch_dtype="bfloat16",
    ),
    # Llama 3.2 1B's shape (Llama 3's vocabulary): a draft model for llama-3-8b
    "llama-3.2-1b": dict(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        tie_word_embeddings=True,
        bos_token_id=128000,
        eos_token_id=128001,
        torch_dtype="bfloat16",
    ),
    "llama-2-7b": dict(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        max_position_embeddings=4096,
        torch_dtype="float16",
    ),
    "mistral-7b": dict(
        architecture="MistralForCausalLM",
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        torch_dtype="bfloat16",
    ),
    # served with tensor parallelism (the simulator; weights random if ever built)
    "llama-3.1-8b": dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
        rope_theta=500000.0, bos_token_id=128000, eos_token_id=128001, torch_dtype="bfloat16",
    ),
    "llama-3.1-70b": dict(
        vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
        num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=131072,
        rope_theta=500000.0, bos_token_id=128000, eos_token_id=128001, torch_dtype="bfloat16",
    ),
    # Qwen3-32B's shape (its q/k norms are not modelled: a few thousand parameters)
    "qwen3-32b": dict(
        vocab_size=151936, hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
        num_attention_heads=64, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
        bos_token_id=151643, eos_token_id=151645, torch_dtype="bfloat16",
    ),
    **MOE_PRESETS,
}


# The public Hugging Face checkpoint of each preset's shape: what `vllm serve` and other
# engines take as the model id (plan prints it). The test shapes (tiny, small, tiny-moe,
# small-moe) have none.
HF_IDS: dict[str, str] = {
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B-Instruct",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
    "qwen3-32b": "Qwen/Qwen3-32B",
    # Llama 3's shape: 8192 positions, no rope scaling (3.1 has 131072 and llama3 scaling)
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B-Instruct",
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B-Instruct",
    "llama-2-7b": "meta-llama/Llama-2-7b-chat-hf",
    "mistral-7b": "mistralai/Mistral-7B-Instruct-v0.2",  # 32768 positions, rope theta 1e6
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "qwen1.5-moe-a2.7b": "Qwen/Qwen1.5-MoE-A2.7B-Chat",
}


def hf_model_id(model: str) -> str | None:
    """The model id another engine takes for `model`: a preset's HF id, a path or id as
    given; None for a preset with no public checkpoint."""
    if model in PRESETS:
        return HF_IDS.get(model)
    return model


def resolve_model_config(model: str | ModelConfig, shape_only: bool = False) -> ModelConfig:
    """A preset name, an HF folder or its config.json, or a ModelConfig; `shape_only`: for
    the simulator (ModelConfig.from_hf_dict)."""
    if isinstance(model, ModelConfig):
        return model
    if model in PRESETS:
        return preset_config(model)
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise EngineError(
            f"model {model!r} is neither a preset ({', '.join(PRESETS)}) nor an HF folder "
            f"with a config.json"
        )
    return ModelConfig.from_file(path, shape_only=shape_only)


def preset_config(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise EngineError(f"unknown model preset {name!r} (known: {', '.join(PRESETS)})")
    return ModelConfig(**PRESETS[name])
