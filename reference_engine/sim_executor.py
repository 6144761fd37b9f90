"""The simulated executor: no model, a virtual clock advanced by the cost model's step time,
and deterministic pseudo tokens, a function of (seed, request id, position) only, so the same
request yields the same tokens whatever the batch, the scheduler or a preemption."""

from __future__ import annotations

import zlib

from cbbench.reference_engine.cost_model import CostModel
from cbbench.reference_engine.executor import ScheduledChunk
from cbbench.reference_engine.model_config import ModelConfig


class SimExecutor:
    def __init__(
        self,
        model_config: ModelConfig,
        cost_model: CostModel,
        seed: int = 0,
        eos_probability: float = 0.0,
    ) -> None:
        assert 0.0 <= eos_probability <= 1.0
        self.model_config = model_config
        self.cost_model = cost_model
        self.seed = seed
        self.eos_probability = eos_probability
        self.eos_ids = model_config.eos_token_ids
        self.clock = 0.0
        self.last_step_time = 0.0
        self._draft_time = 0.0  # speculative: draft-model time of this step (SimProposer)

    def now(self) -> float:
        return self.clock

    def advance_to(self, t: float) -> None:
        """Idle until virtual time t (never backwards)."""
        self.clock = max(self.clock, t)

    def token_for(self, request_id: str, position: int) -> int:
        """The token a request gets at `position` of its token ids: EOS with probability
        `eos_probability`, otherwise a pseudo-random non-EOS id."""
        h = zlib.crc32(f"{self.seed}:{request_id}:{position}".encode())
        if self.eos_ids and self.eos_probability and (h >> 8) / (1 << 24) < self.eos_probability:
            return self.eos_ids[0]
        vocab = self.model_config.vocab_size
        tok = zlib.crc32(f"t{h}".encode()) % vocab
        while tok in self.eos_ids:
            tok = (tok + 1) % vocab
        return tok

    def add_draft_time(self, seconds: float) -> None:
        """Charge the draft model's steps to the next execute()."""
        self._draft_time += seconds

    def execute(self, chunks: list[ScheduledChunk]) -> list[list[int]]:
        verify = self.cost_model.step_time(
            (c.start, c.num_scheduled_tokens, c.samples) for c in chunks
        )
        self.last_step_time = self._draft_time + verify
        self._draft_time = 0.0
        self.clock += self.last_step_time
        return [self._tokens(c) if c.samples else [] for c in chunks]

    def _tokens(self, c: ScheduledChunk) -> list[int]:
        """The request's own tokens from c.end on: drafts while they match, then one more."""
        rid, out = c.seq.request_id, []
        for j, d in enumerate(c.spec_token_ids):
            out.append(self.token_for(rid, c.end + j))
            if out[-1] != d:
                return out
        out.append(self.token_for(rid, c.end + len(c.spec_token_ids)))
        return out
