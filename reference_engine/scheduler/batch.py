"""Run-to-completion batching (static and dynamic): a batch is formed while nothing runs,
KV is reserved for each member up front, and the batch runs until its last member ends.
Finished members keep their slot (and their KV) until then: the waste continuous batching
removes."""

from __future__ import annotations

from abc import abstractmethod

from cbbench.reference_engine.core.executor import ScheduledChunk
from cbbench.reference_engine.core.sequence import Sequence, SequenceStatus
from cbbench.reference_engine.scheduler.base import Scheduler, SchedulerOutput


class RunToCompletionScheduler(Scheduler):
    batch: list[Sequence]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batch = []
        self._members: set[Sequence] = set()  # = batch, for O(1) membership
        self._num_finished = 0  # members finished or aborted: the batch ends at len(batch)

    @abstractmethod
    def _batch_size_to_form(self, now: float) -> int:
        """How many waiting requests to take now (0 = keep waiting)."""

    @abstractmethod
    def reserve_tokens(self, seq: Sequence) -> int:
        """KV token slots reserved for seq at admission."""

    def schedule(self, now: float) -> SchedulerOutput:
        if not self.batch and self.waiting:
            self._form_batch(now)
        chunks: list[ScheduledChunk] = []
        total = 0
        finished = SequenceStatus.FINISHED
        for s in self.batch:
            if s.status is not finished:
                n = len(s.token_ids) - s.num_computed_tokens
                chunks.append(ScheduledChunk(s, n))
                total += n
        return SchedulerOutput(chunks, [], total)

    def _form_batch(self, now: float) -> None:
        bm = self.block_manager
        for _ in range(self._batch_size_to_form(now)):
            seq = self.waiting.peek()
            if not bm.allocate_slots(seq, self.reserve_tokens(seq)):
                break  # the pool is full of reservations: the rest waits for the next batch
            self.waiting.pop()
            seq.status = SequenceStatus.RUNNING
            seq.metrics.first_scheduled_time = now
            self.batch.append(seq)
            self._members.add(seq)
        assert self.batch or not self.waiting or self._batch_size_to_form(now) == 0, (
            "a request that can never fit the KV pool was admitted to the queue"
        )

    def _member_done(self) -> None:
        self._num_finished += 1
        if self._num_finished == len(self.batch):
            assert all(s.is_finished for s in self.batch)
            for s in self.batch:
                self.block_manager.free(s)
            self.batch = []
            self._members.clear()
            self._num_finished = 0

    def finish(self, seq: Sequence) -> None:
        assert seq in self._members
        self._member_done()

    def abort(self, seq: Sequence) -> None:
        if seq in self.waiting:
            self.waiting.remove(seq)
            return
        if seq in self._members:
            self.block_manager.free(seq)  # its slot stays idle until the batch ends
            self._member_done()

    def running(self) -> list[Sequence]:
        finished = SequenceStatus.FINISHED
        return [s for s in self.batch if s.status is not finished]

    @property
    def num_running(self) -> int:
        return len(self.batch) - self._num_finished

    def holders(self) -> list[Sequence]:
        return list(self.batch)

    def _oldest_wait(self, now: float) -> float:
        oldest = self.waiting.oldest()
        return now - oldest.metrics.arrival_time if oldest else 0.0
