"""One request inside the engine: its tokens, its KV blocks and its progress."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from cbbench.reference_engine.core.outputs import RequestMetrics
from cbbench.reference_engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    metrics: RequestMetrics
    priority: int = 0  # lower = served earlier
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    token_ids: list[int] = field(default_factory=list)  # prompt + generated
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache (vLLM v1 semantics)
    block_table: list[int] = field(default_factory=list)
    seq_index: int = 0  # order in which the engine received it (the tie-break among equals)
    num_draft_computed: int = 0  # speculative draft model: tokens whose draft K/V is valid
    # when to stop, resolved once (the engine adds the model's EOS ids unless ignore_eos):
    # a token in stop_token_ids once min_tokens are out, or num_tokens reaching max_num_tokens
    stop_token_ids: frozenset[int] = frozenset()
    max_num_tokens: int = 0  # prompt + max_tokens (0: resolved from sampling_params)
    # P/D disaggregation (kv_transfer/): a prefill worker ships the prompt's KV when it
    # finishes (kv_export); a decode worker's sequence starts with the prompt's KV arriving
    # from it: the leading `num_external_tokens` are computed once the payload (kv_import)
    # is copied into the blocks admission gives it
    kv_export: bool = False
    kv_import: Any = None  # a KVPayload until loaded
    num_external_tokens: int = 0

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)
        p = self.sampling_params
        if not self.stop_token_ids:
            self.stop_token_ids = frozenset(p.stop_token_ids)
        if not self.max_num_tokens:
            self.max_num_tokens = len(self.prompt_token_ids) + p.max_tokens

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
