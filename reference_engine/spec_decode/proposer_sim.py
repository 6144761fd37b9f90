"""The simulator's proposer: no draft model runs; each draft token is the simulated target's
own token (accepted) with probability `acceptance_rate`, drawn per (request, position) from a
hash, else a wrong token. Verification in SimExecutor then accepts exactly those, so the
simulated output is the same with and without speculation, and the accepted length per step
is geometric, as for a draft whose per-token acceptance is that rate.

Time: a "draft" method costs the draft model's decode steps, taken from a CostModel of the
draft (one step per draft position over the sequences still drafting); "ngram" costs nothing
on the device. The verify forward is the target's ordinary step over k + 1 tokens per
sequence (SimExecutor asks the target's CostModel)."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from cbbench.reference_engine.core.executor import ScheduledChunk

if TYPE_CHECKING:
    from cbbench.reference_engine.execution.cost_model import CostModel
    from cbbench.reference_engine.execution.sim_executor import SimExecutor


class SimProposer:
    def __init__(
        self,
        executor: SimExecutor,
        acceptance_rate: float,
        draft_cost: CostModel | None = None,
        seed: int = 0,
    ) -> None:
        assert 0.0 <= acceptance_rate <= 1.0
        self.executor = executor
        self.acceptance_rate = acceptance_rate
        self.draft_cost = draft_cost
        self.seed = seed

    def _accepts(self, request_id: str, position: int) -> bool:
        # a cryptographic hash: CRC32 of neighbouring positions is correlated (linear)
        d = hashlib.blake2b(f"{self.seed}:{request_id}:{position}".encode(), digest_size=8)
        return int.from_bytes(d.digest()) / (1 << 64) < self.acceptance_rate

    def propose(self, chunks: list[ScheduledChunk]) -> None:
        ex = self.executor
        vocab = ex.model_config.vocab_size
        active = [c for c in chunks if c.num_lookahead]
        for c in active:
            rid, n = c.seq.request_id, c.seq.num_tokens
            drafts = []
            for pos in range(n, n + c.num_lookahead):
                true = ex.token_for(rid, pos)
                drafts.append(true if self._accepts(rid, pos) else (true + 1) % vocab)
            c.spec_token_ids = drafts
        if self.draft_cost is not None and active:
            t = 0.0
            for i in range(max(c.num_lookahead for c in active)):
                live = [c for c in active if c.num_lookahead > i]
                t += self.draft_cost.step_time((c.seq.num_tokens + i - 1, 1, True) for c in live)
            ex.add_draft_time(t)
