"""What the engine reports: per-request outputs each step, and engine-wide stats."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cbbench.reference_engine.core.spec_decode_stats import SpecDecodeStats


@dataclass
class RequestMetrics:
    arrival_time: float  # engine clock (time.monotonic(), or virtual seconds in the simulator)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    # speculative decoding: draft tokens scored by the target, and how many it accepted
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def queue_time(self) -> float | None:
        """Arrival -> first scheduled, in seconds."""
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time


@dataclass
class TokenLogprob:
    """One output token's log-probability under the model (log-softmax of its raw logits,
    before temperature/top-k/top-p, as vLLM reports), and the `k` most likely tokens."""

    token_id: int
    logprob: float
    rank: int  # 1 = the most likely token
    top: list[tuple[int, float]]  # (token id, logprob), most likely first; k of them


@dataclass
class RequestOutput:
    request_id: str
    new_token_ids: list[int]  # tokens produced for this request in this step (0 or 1, or more)
    num_prompt_tokens: int
    num_output_tokens: int  # total so far
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | None while running
    metrics: RequestMetrics
    logprobs: list[TokenLogprob] | None = None  # one per new token, when params.logprobs
    embedding: list[float] | None = None  # params.embed: the pooled prompt (pooling.py)
    kv_transfer: Any = None  # a prefill worker's finished request: its KVPayload


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    num_preempted_total: int
    kv_blocks_used: int
    kv_blocks_total: int
    kv_reserved_unused_tokens: (
        int  # slots held by a request but not (yet) filled: static/dynamic waste
    )
    batch_occupancy: float  # scheduled sequences / max batch slots in the last step
    num_batched_tokens: int  # tokens computed in the last step
    step_time_s: float  # duration of the last step (virtual in the simulator)
    spec_decode: SpecDecodeStats | None = None  # cumulative counters; None: speculation off
    # host time to build the last step: scheduler decision + input preparation (wall s)
    scheduler_time_s: float = 0.0
    # executor idle between the end of the previous step's compute and the start of this
    # one's (engine clock); None when the engine had been idle (nothing to compute) before
    step_gap_s: float | None = None
    num_steps: int = 0  # steps computed so far (a consumer observes each step once)
    # MoE models: tokens routed to each expert of each layer since the start, cumulative
    # ([layer][expert], [] for a dense layer; read from the executor when stats are read);
    # None for dense models
    expert_load: list[list[int]] | None = None
    # the running limit admission obeyed in the last step (fixed: the policy's batch slots;
    # --max-num-seqs auto: the adaptive one) and the adaptive limit's decisions so far
    num_seqs_limit: int = 0
    num_seqs_limit_ups: int = 0
    num_seqs_limit_downs: int = 0

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0
