"""Static batching: wait for exactly B requests, reserve the longest possible sequence
(max_model_len) per slot, run the batch to completion. A partial batch is flushed once its
oldest request has waited `drain_timeout_s` (the tail of a run), or at once when no request
can arrive any more (`input_closed`: a drain timeout no arrival can end is pure idle)."""

from __future__ import annotations

from cbbench.reference_engine.core.sequence import Sequence
from cbbench.reference_engine.scheduler.batch import RunToCompletionScheduler


class StaticScheduler(RunToCompletionScheduler):
    name = "static"

    def _batch_size_to_form(self, now: float) -> int:
        cfg = self.config.static
        if len(self.waiting) >= cfg.batch_size:
            return cfg.batch_size
        if self.waiting and (self.input_closed or self._oldest_wait(now) >= cfg.drain_timeout_s):
            return len(self.waiting)
        return 0

    def reserve_tokens(self, seq: Sequence) -> int:
        return self.max_model_len

    def next_wakeup(self, now: float) -> float | None:
        if self.batch or not self.waiting:
            return None
        oldest = self.waiting.oldest()
        assert oldest is not None
        return oldest.metrics.arrival_time + self.config.static.drain_timeout_s
