"""The batching policies' settings: one dataclass per policy (static, dynamic, continuous),
each field with its flag (config/flags.py: flag), each checked in its `validate`.

A new policy registers its settings dataclass in SCHEDULER_SETTINGS (EngineConfig then holds
an instance under that name: add the field in config.py) and its class in
scheduler/__init__.py; docs/architecture.md shows the steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cbbench.reference_engine.config.flags import flag
from cbbench.reference_engine.errors import EngineError

POLICIES = ("fcfs", "priority")


@dataclass
class StaticConfig:
    """Fixed batch: wait for exactly `batch_size` requests, run them all to completion."""

    batch_size: int = field(
        default=8,
        metadata=flag(
            "--batch-size",
            "B: requests per static batch; also the default of --max-batch-size (dynamic) "
            "and --max-num-seqs (continuous), so one B compares the policies",
        ),
    )
    # A partial batch is flushed once its oldest request waited this long (the tail of a run).
    drain_timeout_s: float = field(
        default=1.0,
        metadata=flag(
            "--drain-timeout",
            "a partial static batch is flushed once its oldest request waited this long",
            unit="s",
        ),
    )

    def validate(self) -> None:
        if self.batch_size < 1:
            raise EngineError(f"static.batch_size must be >= 1, got {self.batch_size}")
        if self.drain_timeout_s < 0:
            raise EngineError(f"static.drain_timeout_s must be >= 0, got {self.drain_timeout_s}")


@dataclass
class DynamicConfig:
    """Request-level batching, Triton-server style: preferred sizes plus a maximum queue delay."""

    max_batch_size: int = field(
        default=8, metadata=flag("--max-batch-size", "most requests in one dynamic batch")
    )
    # empty = only max_batch_size is preferred
    preferred_batch_sizes: tuple[int, ...] = field(
        default=(),
        metadata=flag(
            "--preferred-batch-sizes",
            "batch sizes launched at once, comma list, e.g. 4,8 (empty: max batch size only)",
            metavar="N,N",
        ),
    )
    max_queue_delay_s: float = field(
        default=0.01,
        metadata=flag(
            "--max-queue-delay",
            "the oldest request waits at most this long for a preferred batch",
            unit="s",
        ),
    )
    # reject (QueueFullError) beyond this many waiting
    max_queue_size: int | None = field(
        default=None,
        metadata=flag("--max-queue-size", "dynamic: reject requests beyond this many waiting"),
    )

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

    max_num_seqs: int = field(
        default=64,
        metadata=flag(
            "--max-num-seqs",
            "most sequences running in one step; `auto` or `auto:N`: a limit that follows KV "
            "usage and preemptions (scheduler/adaptive_limit.py) up to N (else B, else 64)",
            metavar="N|auto[:N]",
            auto="adaptive_num_seqs",
        ),
    )
    # set by `--max-num-seqs auto`: max_num_seqs is then the ceiling of the adaptive limit
    adaptive_num_seqs: bool = False
    # token budget of one step
    max_num_batched_tokens: int = field(
        default=2048,
        metadata=flag(
            "--max-num-batched-tokens",
            "token budget of one step (raised to --max-num-seqs when below it)",
        ),
    )
    enable_chunked_prefill: bool = field(
        default=True,
        metadata=flag(
            "--enable-chunked-prefill",
            "split long prompts over steps",
            aliases=("--no-chunked-prefill",),
        ),
    )
    policy: str = field(
        default="fcfs",
        metadata=flag("--policy", "admission order of waiting requests", choices=POLICIES),
    )
    # priority policy: effective priority = priority - aging_rate * seconds waited
    aging_rate: float = field(
        default=1.0,
        metadata=flag(
            "--aging-rate",
            "priority policy: priority levels a waiting request gains per second",
            unit="1/s",
        ),
    )
    # a request waiting longer is admitted by force
    max_queue_wait_s: float | None = field(
        default=None,
        metadata=flag(
            "--max-queue-wait", "a request waiting this long is admitted by force", unit="s"
        ),
    )
    max_prefills_per_step: int | None = field(
        default=None, metadata=flag("--max-prefills-per-step", "new prompts admitted per step")
    )
    # fraction of blocks kept free when admitting new requests
    watermark: float = field(
        default=0.01,
        metadata=flag("--watermark", "fraction of KV blocks kept free when admitting requests"),
    )
    # MoE models (scheduler/expert_balance.py): admission order that balances expert load
    expert_balance: bool = field(
        default=False,
        metadata=flag(
            "--expert-balance",
            "MoE models: when more requests wait than fit, admit first those among the next "
            "--expert-balance-window waiting whose predicted routing lowers the running "
            "batch's expert imbalance",
        ),
    )
    expert_balance_window: int = field(
        default=8,
        metadata=flag(
            "--expert-balance-window",
            "--expert-balance: waiting requests considered per admission (queue order beyond)",
        ),
    )

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
        if self.expert_balance_window < 1:
            raise EngineError(
                f"continuous.expert_balance_window must be >= 1, got {self.expert_balance_window}"
            )


# The batching policies: name -> settings dataclass. EngineConfig holds one instance of each
# under the same name; scheduler/__init__.py maps the same names to their classes.
SCHEDULER_SETTINGS: dict[str, type] = {
    "static": StaticConfig,
    "dynamic": DynamicConfig,
    "continuous": ContinuousConfig,
}
SCHEDULERS = tuple(SCHEDULER_SETTINGS)
