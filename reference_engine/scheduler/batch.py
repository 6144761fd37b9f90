"""Run-to-completion batching (static and dynamic): a batch is formed while nothing runs,
KV is reserved for each member up front, and the batch runs until its last member ends.
Finished members keep their slot (and their KV) until then: the waste continuous batching
removes."""

from __future__ import annotations

from abc import abstractmethod

from cbbench.reference_engine.executor import ScheduledChunk
from cbbench.reference_engine.scheduler.base import Scheduler, SchedulerOutput
from cbbench.reference_engine.sequence import Sequence, SequenceStatus


class RunToCompletionScheduler(Scheduler):
    batch: list[Sequence]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batch = []

    @abstractmethod
    def _batch_size_to_form(self, now: float) -> int:
        """How many waiting requests to take now (0 = keep waiting)."""

    @abstractmethod
    def reserve_tokens(self, seq: Sequence) -> int:
        """KV token slots reserved for seq at admission."""

    def schedule(self, now: float) -> SchedulerOutput:
        if not self.batch and self.waiting:
            self._form_batch(now)
        chunks = [
            ScheduledChunk(s, s.num_tokens - s.num_computed_tokens)
            for s in self.batch
            if not s.is_finished
        ]
        return SchedulerOutput(chunks=chunks, num_batched_tokens=sum(c.num_tokens for c in chunks))

    def _form_batch(self, now: float) -> None:
        bm = self.block_manager
        for _ in range(self._batch_size_to_form(now)):
            seq = self.waiting.peek()
            if not bm.allocate_slots(seq, self.reserve_tokens(seq)):
                break  # the pool is full of reservations: the rest waits for the next batch
            self.waiting.pop()
            seq.status = SequenceStatus.RUNNING
            self.batch.append(seq)
        assert self.batch or not self.waiting or self._batch_size_to_form(now) == 0, (
            "a request that can never fit the KV pool was admitted to the queue"
        )

    def _release_if_done(self) -> None:
        if self.batch and all(s.is_finished for s in self.batch):
            for s in self.batch:
                self.block_manager.free(s)
            self.batch = []

    def finish(self, seq: Sequence) -> None:
        assert seq in self.batch
        self._release_if_done()

    def abort(self, seq: Sequence) -> None:
        if seq in self.waiting:
            self.waiting.remove(seq)
            return
        if seq in self.batch:
            self.block_manager.free(seq)  # its slot stays idle until the batch ends
            self._release_if_done()

    def running(self) -> list[Sequence]:
        return [s for s in self.batch if not s.is_finished]

    def holders(self) -> list[Sequence]:
        return list(self.batch)

    def _oldest_wait(self, now: float) -> float:
        oldest = self.waiting.oldest()
        return now - oldest.metrics.arrival_time if oldest else 0.0
