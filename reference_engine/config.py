"""Engine configuration: one EngineConfig, with one sub-config per batching policy.

Everything a user can get wrong is checked here and raised as EngineError naming the field,
so a bad flag never reaches the scheduler.

Each field that users may set carries its command-line flag in its metadata (`flag(...)`):
`reference_engine/options.py` builds every command's engine flags from these dataclasses, so
a new setting is ONE field here (plus its check in `validate`). A batching policy registers
its settings dataclass in `SCHEDULER_SETTINGS` (and its class in `scheduler/__init__.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cbbench.reference_engine.errors import EngineError

POLICIES = ("fcfs", "priority")
EXECUTORS = ("real", "sim")
SPECULATIVE_METHODS = ("ngram", "draft")
ATTENTION_BACKENDS = ("auto", "torch", "triton")
GIB = 2**30  # --kv-cache-memory-gb is GiB on every path


def flag(
    name: str,
    help: str,
    *,
    unit: str | None = None,
    choices: tuple[str, ...] | None = None,
    aliases: tuple[str, ...] = (),
    metavar: str | None = None,
) -> dict[str, Any]:
    """Field metadata naming the field's command-line flag (see options.py).

    `unit` is said in --help ("GiB", "s"); `aliases` are older spellings that keep working
    (deprecated); a bool field becomes `--name/--no-name`."""
    return {
        "flag": {
            "name": name,
            "help": help,
            "unit": unit,
            "choices": choices,
            "aliases": aliases,
            "metavar": metavar,
        }
    }


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
        default=64, metadata=flag("--max-num-seqs", "most sequences running in one step")
    )
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


# The batching policies: name -> settings dataclass. EngineConfig holds one instance of each
# under the same name; scheduler/__init__.py maps the same names to their classes.
SCHEDULER_SETTINGS: dict[str, type] = {
    "static": StaticConfig,
    "dynamic": DynamicConfig,
    "continuous": ContinuousConfig,
}
SCHEDULERS = tuple(SCHEDULER_SETTINGS)


@dataclass
class SpeculativeConfig:
    """Speculative decoding (continuous scheduler only): each decode step verifies up to
    `num_speculative_tokens` proposed tokens per sequence in the one target forward."""

    # None (off) | "ngram" (prompt lookup) | "draft" (a draft model)
    method: str | None = field(
        default=None,
        metadata=flag(
            "--speculative-method",
            "propose draft tokens by n-gram prompt lookup or with a draft model (default: off)",
            choices=SPECULATIVE_METHODS,
        ),
    )
    num_speculative_tokens: int = field(
        default=4, metadata=flag("--num-speculative-tokens", "drafts per step")
    )
    # method "draft": a preset or HF folder with the target's vocab
    model: str | None = field(
        default=None,
        metadata=flag(
            "--speculative-model",
            "draft model for --speculative-method draft: a preset or HF folder with the "
            "target's vocabulary (the target itself is a 100%% acceptance control)",
        ),
    )
    # method "ngram": shortest / longest suffix looked up in the context
    ngram_min: int = field(default=1, metadata=flag("--ngram-min", "shortest suffix looked up"))
    ngram_max: int = field(default=3, metadata=flag("--ngram-max", "longest suffix looked up"))
    # simulator only: probability that each draft token is accepted (the proposer is modelled)
    acceptance_rate: float = field(
        default=0.7,
        metadata=flag(
            "--spec-acceptance-rate",
            "simulator only: per-draft-token acceptance probability",
        ),
    )

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
            raise EngineError(
                "speculative method 'draft' needs a draft model (--speculative-model)"
            )
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
    # preset name (model_config.PRESETS) or an HF folder
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
    attention_backend: str = field(
        default="auto",
        metadata=flag("--attention-backend", "attention kernels", choices=ATTENTION_BACKENDS),
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


def kv_blocks_for_memory(memory_gib: float, bytes_per_block: int) -> int:
    """KV blocks that fit in `memory_gib` GiB (2**30 bytes): the one rule for both executors."""
    return int(memory_gib * GIB // bytes_per_block)
