"""Dynamic (request-level) batching, Triton-server style: when idle, take the largest
preferred batch size the queue can fill; otherwise wait until the oldest request has waited
`max_queue_delay_s` and take what is there (up to max_batch_size). KV is reserved for
prompt + max_tokens per request; the batch runs to completion. `max_queue_size` rejects."""

from __future__ import annotations

from cbbench.reference_engine.core.sequence import Sequence
from cbbench.reference_engine.scheduler.batch import RunToCompletionScheduler


class DynamicScheduler(RunToCompletionScheduler):
    name = "dynamic"

    def _batch_size_to_form(self, now: float) -> int:
        cfg = self.config.dynamic
        cap = min(len(self.waiting), cfg.max_batch_size)
        fillable = [p for p in cfg.preferred if p <= cap]
        if fillable:
            return fillable[-1]
        if self.waiting and self._oldest_wait(now) >= cfg.max_queue_delay_s:
            return cap
        return 0

    def reserve_tokens(self, seq: Sequence) -> int:
        return min(seq.num_prompt_tokens + seq.sampling_params.max_tokens, self.max_model_len)

    def next_wakeup(self, now: float) -> float | None:
        if self.batch or not self.waiting:
            return None
        oldest = self.waiting.oldest()
        assert oldest is not None
        return oldest.metrics.arrival_time + self.config.dynamic.max_queue_delay_s
