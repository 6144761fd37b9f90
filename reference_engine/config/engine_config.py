"""Engine configuration: one EngineConfig, with one sub-config per batching policy
(policy_config.py) and one for speculative decoding (speculative_config.py).

Everything a user can get wrong is checked here and raised as EngineError naming the field,
so a bad flag never reaches the scheduler.

Each field that users may set carries its command-line flag in its metadata (`flag(...)`,
config_flags.py): `reference_engine/config/options.py` builds every command's engine flags from
these dataclasses, so a new setting is ONE field (plus its check in `validate`). A batching
policy registers its settings dataclass in `policy_config.SCHEDULER_SETTINGS` (and its class
in `scheduler/__init__.py`). Every name stays importable from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cbbench.reference_engine.config.flags import flag
from cbbench.reference_engine.config.policy_config import (
    POLICIES,
    SCHEDULER_SETTINGS,
    SCHEDULERS,
    ContinuousConfig,
    DynamicConfig,
    StaticConfig,
)
from cbbench.reference_engine.config.speculative_config import (
    SPECULATIVE_METHODS,
    SpeculativeConfig,
)
from cbbench.reference_engine.errors import EngineError

__all__ = [
    "ATTENTION_BACKENDS",
    "EXECUTORS",
    "GIB",
    "KV_CACHE_DTYPES",
    "POLICIES",
    "SCHEDULERS",
    "SCHEDULER_SETTINGS",
    "SPECULATIVE_METHODS",
    "ContinuousConfig",
    "DynamicConfig",
    "EngineConfig",
    "SpeculativeConfig",
    "StaticConfig",
    "flag",
    "kv_blocks_for_memory",
]

ROLES = ("both", "prefill", "decode")
EXECUTORS = ("real", "sim")
ATTENTION_BACKENDS = ("auto", "torch", "triton")
# vLLM's --kv-cache-dtype names; the same tuple as kernels/kv_quant.py KV_CACHE_DTYPES (tested)
KV_CACHE_DTYPES = ("auto", "bf16", "fp8", "int8")
QUANTIZATIONS = ("int8",)  # weight-only, on load (vLLM's --quantization flag name)
GIB = 2**30  # --kv-cache-memory-gb is GiB on every path


@dataclass
class EngineConfig:
    # preset name (model/config.py: PRESETS) or an HF folder
    model: str = field(
        default="tiny",
        metadata=flag(
            "--model", "model preset (tiny, small, qwen2.5-0.5b, llama-3-8b, ...) or HF folder"
        ),
    )
    device: str = field(default="cpu", metadata=flag("--device", "cpu | cuda | cuda:N"))
    dtype: str = field(
        default="float32",
        metadata=flag("--dtype", "float32 | float16 | bfloat16 | auto (the model's own)"),
    )
    scheduler: str = field(
        default="continuous",
        metadata=flag(
            "--scheduler",
            f"batching policy: {', '.join(SCHEDULERS)}; commands that compare policies take "
            "a comma list",
            metavar="NAME[,NAME]",
        ),
    )
    static: StaticConfig = field(default_factory=StaticConfig)
    dynamic: DynamicConfig = field(default_factory=DynamicConfig)
    continuous: ContinuousConfig = field(default_factory=ContinuousConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    block_size: int = field(default=16, metadata=flag("--block-size", "tokens per KV block"))
    # None: sized from kv_cache_memory_gb or the device
    num_kv_blocks: int | None = field(
        default=None,
        metadata=flag("--num-kv-blocks", "KV pool size in blocks (beats --kv-cache-memory-gb)"),
    )
    kv_cache_memory_gb: float | None = field(
        default=None,
        metadata=flag(
            "--kv-cache-memory-gb",
            "KV pool size in memory (default: sized from the device)",
            unit="GiB",
        ),
    )
    # None: the model's max_position_embeddings
    max_model_len: int | None = field(
        default=None,
        metadata=flag(
            "--max-model-len", "longest prompt + output (default: the model's context length)"
        ),
    )
    enable_prefix_caching: bool = field(
        default=False,
        metadata=flag("--enable-prefix-caching", "reuse KV blocks of shared prompt prefixes"),
    )
    # prefill/decode disaggregation (engine/disagg.py, docs/disaggregation.md)
    role: str = field(
        default="both",
        metadata=flag(
            "--role",
            "both serves whole requests; prefill runs prompts and ships their KV; decode "
            "continues requests from a prefill worker's KV (behind `cbbench route --prefill "
            "--decode`)",
            choices=ROLES,
        ),
    )
    # "real" (ModelRunner) | "sim" (SimExecutor, virtual clock)
    executor: str = field(
        default="real",
        metadata=flag(
            "--executor",
            "real torch model, or sim: the cost-model simulator (virtual time, SIMULATED)",
            choices=EXECUTORS,
        ),
    )
    # simulator only: a cost_model preset, "steps", or a JSON path
    hardware: str = field(
        default="h100",
        metadata=flag(
            "--hardware",
            "simulator only: a100-80g, h100-sxm (h100), h200, cpu-measured, steps (1 time "
            "unit per step), or a JSON from `cbbench calibrate`",
        ),
    )
    # simulator, MoE models: routing and expert parallelism (execution/moe_cost.py)
    sim_expert_skew: float = field(
        default=0.0,
        metadata=flag(
            "--sim-expert-skew",
            "simulator, MoE models: Zipf exponent of each routing topic's expert popularity "
            "(0 = uniform routing)",
        ),
    )
    sim_expert_topics: int = field(
        default=1,
        metadata=flag(
            "--sim-expert-topics",
            "simulator, MoE models: routing topics; each request follows one (a hash of its "
            "id), each topic favours its own experts",
        ),
    )
    expert_parallel: int = field(
        default=1,
        metadata=flag(
            "--expert-parallel",
            "simulator, MoE models: devices the experts are spread over (attention and dense "
            "layers data-parallel); each layer waits for its slowest device",
        ),
    )
    # the simulator: a replica of this many GPUs, weights and KV heads sharded (cost_model.py)
    tensor_parallel_size: int = field(
        default=1,
        metadata=flag(
            "--tensor-parallel-size",
            "simulator: GPUs per replica, weights and KV heads split over them, two "
            "all-reduces a layer priced from the hardware's link (vLLM's flag)",
        ),
    )
    attention_backend: str = field(
        default="auto",
        metadata=flag("--attention-backend", "attention kernels", choices=ATTENTION_BACKENDS),
    )
    # int8 / fp8: codes + an fp16 scale per (token, KV head), kernels/kv_quant.py
    kv_cache_dtype: str = field(
        default="auto",
        metadata=flag(
            "--kv-cache-dtype",
            "KV-cache storage: auto (the model dtype), bf16, fp8 (e4m3) or int8 (both with a "
            "scale per token and head: ~3.9x fp32's blocks per GiB at head_dim 64)",
            choices=KV_CACHE_DTYPES,
        ),
    )
    # int8 codes + an fp32 scale per output row for every linear, kernels/cpu_linear_bf16.py
    quantization: str | None = field(
        default=None,
        metadata=flag(
            "--quantization",
            "weight-only quantization on load: int8 (CPU, every linear; default: none)",
            choices=QUANTIZATIONS,
        ),
    )
    seed: int = field(
        default=0,
        metadata=flag(
            "--seed",
            "seed of the engine (random weights, sampling) and of a generated workload",
        ),
    )
    # reject (QueueFullError) beyond this many waiting, any policy
    max_waiting: int | None = field(
        default=None,
        metadata=flag(
            "--max-waiting", "waiting-queue limit, any policy; beyond it requests get HTTP 429"
        ),
    )
    # build step N+1 while step N computes (async_scheduling.py); greedy outputs unchanged
    async_scheduling: bool = field(
        default=False,
        metadata=flag(
            "--async-scheduling",
            "build the next step while the current one computes (greedy outputs unchanged; "
            "the simulator models the overlap)",
        ),
    )
    # CUDA only: decode steps replay a CUDA graph per batch-size bucket (cuda_graphs.py)
    enforce_eager: bool = field(
        default=False,
        metadata=flag(
            "--enforce-eager",
            "CUDA: run every step eagerly instead of replaying captured decode CUDA graphs "
            "(no effect on the CPU)",
        ),
    )

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise EngineError(
                f"scheduler must be one of {', '.join(SCHEDULERS)}, got {self.scheduler!r}"
            )
        if self.role not in ROLES:
            raise EngineError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if self.role != "both" and (self.scheduler != "continuous" or self.executor != "real"):
            raise EngineError(
                f"--role {self.role} needs --scheduler continuous and --executor real (the KV "
                f"that travels lives in the real executor's paged cache)"
            )
        if self.executor not in EXECUTORS:
            raise EngineError(
                f"executor must be one of {', '.join(EXECUTORS)}, got {self.executor!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise EngineError(
                f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got "
                f"{self.kv_cache_dtype!r}"
            )
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise EngineError(
                f"quantization must be one of {', '.join(QUANTIZATIONS)} or None, got "
                f"{self.quantization!r}"
            )
        if self.quantization is not None and self.executor == "sim":
            raise EngineError(
                f"--quantization {self.quantization}: the simulated executor has no cost model "
                "for quantized weights (use --executor real)"
            )
        if self.quantization is not None and self.device != "cpu":
            raise EngineError(
                f"--quantization {self.quantization}: CPU only (a C++ CPU kernel), not device "
                f"{self.device!r}"
            )
        if self.block_size < 1:
            raise EngineError(f"block_size must be >= 1, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise EngineError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.kv_cache_memory_gb is not None and self.kv_cache_memory_gb <= 0:
            raise EngineError(f"kv_cache_memory_gb must be > 0, got {self.kv_cache_memory_gb}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise EngineError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_waiting is not None and self.max_waiting < 1:
            raise EngineError(f"max_waiting must be >= 1, got {self.max_waiting}")
        if self.sim_expert_skew < 0:
            raise EngineError(f"sim_expert_skew must be >= 0, got {self.sim_expert_skew}")
        if self.tensor_parallel_size < 1:
            raise EngineError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.tensor_parallel_size > 1 and self.executor != "sim":
            raise EngineError(
                f"--tensor-parallel-size {self.tensor_parallel_size}: the simulator's only "
                "(the reference engine runs on one device); use --executor sim"
            )
        if self.sim_expert_topics < 1 or self.expert_parallel < 1:
            raise EngineError(
                f"sim_expert_topics and expert_parallel must be >= 1, got "
                f"{self.sim_expert_topics}, {self.expert_parallel}"
            )
        self.static.validate()
        self.dynamic.validate()
        self.continuous.validate()
        self.speculative.validate()
        if self.speculative.enabled and self.scheduler != "continuous":
            raise EngineError(
                f"speculative decoding needs the continuous scheduler (got {self.scheduler!r}): "
                f"static and dynamic batching run one token per sequence per step"
            )
        if self.speculative.enabled and self.async_scheduling:
            raise EngineError(
                "speculative decoding and async scheduling cannot be combined (as in vLLM's "
                "first async scheduler): a step's drafts depend on the previous step's "
                "accepted tokens; drop --async-scheduling or --speculative-method"
            )

    @property
    def max_batch_slots(self) -> int:
        """Sequences the chosen policy can run at once (the denominator of batch occupancy)."""
        if self.scheduler == "static":
            return self.static.batch_size
        if self.scheduler == "dynamic":
            return self.dynamic.max_batch_size
        return self.continuous.max_num_seqs

    def step_budget(self) -> dict:
        """The prefill step budget, for clients that test chunking (`cbbench probe`, via
        /v1/models); empty for the run-to-completion schedulers (no step budget there)."""
        if self.scheduler != "continuous":
            return {}
        c = self.continuous
        return {
            "max_num_batched_tokens": c.max_num_batched_tokens,
            "enable_chunked_prefill": c.enable_chunked_prefill,
        }


def kv_blocks_for_memory(memory_gib: float, bytes_per_block: int) -> int:
    """KV blocks that fit in `memory_gib` GiB (2**30 bytes): the one rule for both executors."""
    return int(memory_gib * GIB // bytes_per_block)
