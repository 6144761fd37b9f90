"""The simulated executor: no model, a virtual clock advanced by the cost model's step time,
and deterministic pseudo tokens, a function of (seed, request id, position) only, so the same
request yields the same tokens whatever the batch, the scheduler or a preemption."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from cbbench.reference_engine.cost_model import CostModel
from cbbench.reference_engine.executor import ScheduledChunk
from cbbench.reference_engine.model_config import ModelConfig


@dataclass(frozen=True)
class _FrozenChunk:
    request_id: str
    start: int
    num_tokens: int
    spec_token_ids: list[int]
    samples: bool

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def num_scheduled_tokens(self) -> int:
        return self.num_tokens + len(self.spec_token_ids)


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
        self.modeled_gap_s = 0.0  # device idle before the last step (the clock can't show it)

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
        return self.run(self.prepare(chunks))

    # --- async scheduling: the same, split; run inline (virtual time) --------------------
    runs_in_thread = False
    overlap_host = False  # async scheduling: host work hides behind device time

    def prepare(self, chunks: list[ScheduledChunk]) -> list[ScheduledChunk]:
        """A snapshot of the chunks: request, start, tokens, drafts, whether it samples."""
        snap = []
        for c in chunks:
            frozen = _FrozenChunk(
                c.seq.request_id, c.start, c.num_tokens, list(c.spec_token_ids), c.samples
            )
            snap.append(frozen)
        return snap  # type: ignore[return-value]

    def patch(self, step: object, rows: list[int], tokens: list[int]) -> None:
        pass  # pseudo tokens depend on (request, position) only

    def run(self, step: list) -> list[list[int]]:
        work = self.cost_model.work((c.start, c.num_scheduled_tokens, c.samples) for c in step)
        # speculative verify: the LM head runs on every draft row too, not just the last
        drafts = sum(len(c.spec_token_ids) for c in step if c.samples)
        if drafts:
            work.num_samples += drafts
            work.flops += self.cost_model.head_flops * drafts
        device, host = self.cost_model.split_time(work)
        if self.overlap_host:
            verify = max(device, host)
            self.modeled_gap_s = max(0.0, host - device)
        else:
            verify = device + host
            self.modeled_gap_s = host  # the device waits while the host builds the step
        self.last_step_time = self._draft_time + verify
        self._draft_time = 0.0
        self.clock += self.last_step_time
        return [self._tokens(c) if c.samples else [] for c in step]

    def _tokens(self, c: _FrozenChunk) -> list[int]:
        """The request's own tokens from c.end on: drafts while they match, then one more."""
        rid, out = c.request_id, []
        for j, d in enumerate(c.spec_token_ids):
            out.append(self.token_for(rid, c.end + j))
            if out[-1] != d:
                return out
        out.append(self.token_for(rid, c.end + len(c.spec_token_ids)))
        return out
