"""Per-request decoding parameters (names follow vLLM's SamplingParams)."""

from __future__ import annotations

from dataclasses import dataclass

from cbbench.reference_engine.errors import EngineError


@dataclass
class SamplingParams:
    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None  # None: none; k: each output token's logprob + the top k
    embed: bool = False  # pooling request: its output carries the prompt's embedding

    MAX_LOGPROBS = 20  # as vLLM's default max_logprobs

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise EngineError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise EngineError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        if self.temperature < 0:
            raise EngineError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise EngineError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise EngineError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.logprobs is not None and not 0 <= self.logprobs <= self.MAX_LOGPROBS:
            raise EngineError(f"logprobs must be in [0, {self.MAX_LOGPROBS}], got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1
