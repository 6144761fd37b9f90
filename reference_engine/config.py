"""Engine configuration: one EngineConfig, with one sub-config per batching policy.

Everything a user can get wrong is checked here and raised as EngineError naming the field,
so a bad flag never reaches the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cbbench.reference_engine.errors import EngineError

SCHEDULERS = ("static", "dynamic", "continuous")
POLICIES = ("fcfs", "priority")
EXECUTORS = ("real", "sim")
SPECULATIVE_METHODS = ("ngram", "draft")


@dataclass
class StaticConfig:
    """Fixed batch: wait for exactly `batch_size` requests, run them all to completion."""

    batch_size: int = 8
    # A partial batch is flushed once its oldest request waited this long (the tail of a run).
    drain_timeout_s: float = 1.0

    def validate(self) -> None:
        if self.batch_size < 1:
            raise EngineError(f"static.batch_size must be >= 1, got {self.batch_size}")
        if self.drain_timeout_s < 0:
            raise EngineError(f"static.drain_timeout_s must be >= 0, got {self.drain_timeout_s}")


@dataclass
class DynamicConfig:
    """Request-level batching, Triton-server style: preferred sizes plus a maximum queue delay."""

    max_batch_size: int = 8
    preferred_batch_sizes: tuple[int, ...] = ()  # empty = only max_batch_size is preferred
    max_queue_delay_s: float = 0.01
    max_queue_size: int | None = None  # reject (QueueFullError) beyond this many waiting

    def validate(self) -> None:
        if self.max_batch_size < 1:
            raise EngineError(f"dynamic.max_batch_size must be >= 1, got {self.max_batch_size}")
        bad = [b for b in self.preferred_batch_sizes if not 1 <= b <= self.max_batch_size]
        if bad:
            raise EngineError(
                f"dynamic.preferred_batch_sizes must lie in [1, max_batch_size="
                f"{self.max_batch_size}], got {list(self.preferred_batch_sizes)}"
            )
        if self.max_queue_delay_s < 0:
            raise EngineError(
                f"dynamic.max_queue_delay_s must be >= 0, got {self.max_queue_delay_s}"
            )
        if self.max_queue_size is not None and self.max_queue_size < 1:
            raise EngineError(f"dynamic.max_queue_size must be >= 1, got {self.max_queue_size}")

    @property
    def preferred(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.preferred_batch_sizes or (self.max_batch_size,))))


@dataclass
class ContinuousConfig:
    """Iteration-level batching over paged KV (vLLM v1 style)."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048  # token budget of one step
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"  # "fcfs" | "priority"
    # priority policy: effective priority = priority - aging_rate * seconds waited
    aging_rate: float = 1.0
    max_queue_wait_s: float | None = None  # a request waiting longer is admitted by force
    max_prefills_per_step: int | None = None
    watermark: float = 0.01  # fraction of blocks kept free when admitting new requests

    def validate(self) -> None:
        if self.max_num_seqs < 1:
            raise EngineError(f"continuous.max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise EngineError(
                f"continuous.max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs})"
            )
        if self.policy not in POLICIES:
            raise EngineError(
                f"continuous.policy must be one of {', '.join(POLICIES)}, got {self.policy!r}"
            )
        if self.aging_rate < 0:
            raise EngineError(f"continuous.aging_rate must be >= 0, got {self.aging_rate}")
        if self.max_queue_wait_s is not None and self.max_queue_wait_s < 0:
            raise EngineError(
                f"continuous.max_queue_wait_s must be >= 0, got {self.max_queue_wait_s}"
            )
        if self.max_prefills_per_step is not None and self.max_prefills_per_step < 1:
            raise EngineError(
                f"continuous.max_prefills_per_step must be >= 1, got {self.max_prefills_per_step}"
            )
        if not 0 <= self.watermark < 1:
            raise EngineError(f"continuous.watermark must be in [0, 1), got {self.watermark}")


@dataclass
class SpeculativeConfig:
    """Speculative decoding (continuous scheduler only): each decode step verifies up to
    `num_speculative_tokens` proposed tokens per sequence in the one target forward."""

    method: str | None = None  # None (off) | "ngram" (prompt lookup) | "draft" (a draft model)
    num_speculative_tokens: int = 4
    model: str | None = None  # method "draft": a preset or HF folder with the target's vocab
    ngram_min: int = 1  # method "ngram": shortest / longest suffix looked up in the context
    ngram_max: int = 3
    # simulator only: probability that each draft token is accepted (the proposer is modelled)
    acceptance_rate: float = 0.7

    @property
    def enabled(self) -> bool:
        return self.method is not None

    def validate(self) -> None:
        if self.method is None:
            return
        if self.method not in SPECULATIVE_METHODS:
            raise EngineError(
                f"speculative.method must be one of {', '.join(SPECULATIVE_METHODS)}, "
                f"got {self.method!r}"
            )
        if self.num_speculative_tokens < 1:
            raise EngineError(
                f"speculative.num_speculative_tokens must be >= 1, "
                f"got {self.num_speculative_tokens}"
            )
        if self.method == "draft" and not self.model:
            raise EngineError("speculative method 'draft' needs a draft model (--speculative-model)")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise EngineError(
                f"speculative ngram sizes must satisfy 1 <= ngram_min <= ngram_max, got "
                f"{self.ngram_min}, {self.ngram_max}"
            )
        if not 0 <= self.acceptance_rate <= 1:
            raise EngineError(
                f"speculative.acceptance_rate must be in [0, 1], got {self.acceptance_rate}"
            )


@dataclass
class EngineConfig:
    model: str = "tiny"  # preset name (model_config.PRESETS) or an HF folder
    device: str = "cpu"
    dtype: str = "float32"
    scheduler: str = "continuous"
    static: StaticConfig = field(default_factory=StaticConfig)
    dynamic: DynamicConfig = field(default_factory=DynamicConfig)
    continuous: ContinuousConfig = field(default_factory=ContinuousConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: sized from kv_cache_memory_gb or the device
    kv_cache_memory_gb: float | None = None
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    enable_prefix_caching: bool = False
    executor: str = "real"  # "real" (ModelRunner) | "sim" (SimExecutor, virtual clock)
    hardware: str = "h100"  # simulator only: a cost_model preset, "steps", or a JSON path
    attention_backend: str = "auto"
    seed: int = 0
    max_waiting: int | None = None  # reject (QueueFullError) beyond this many waiting, any policy

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise EngineError(
                f"scheduler must be one of {', '.join(SCHEDULERS)}, got {self.scheduler!r}"
            )
        if self.executor not in EXECUTORS:
            raise EngineError(
                f"executor must be one of {', '.join(EXECUTORS)}, got {self.executor!r}"
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
        self.static.validate()
        self.dynamic.validate()
        self.continuous.validate()
        self.speculative.validate()
        if self.speculative.enabled and self.scheduler != "continuous":
            raise EngineError(
                f"speculative decoding needs the continuous scheduler (got {self.scheduler!r}): "
                f"static and dynamic batching run one token per sequence per step"
            )

    @property
    def max_batch_slots(self) -> int:
        """Sequences the chosen policy can run at once (the denominator of batch occupancy)."""
        if self.scheduler == "static":
            return self.static.batch_size
        if self.scheduler == "dynamic":
            return self.dynamic.max_batch_size
        return self.continuous.max_num_seqs
