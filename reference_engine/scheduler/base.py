"""The scheduler interface: what runs in the next step, and who holds which KV blocks."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from operator import attrgetter

from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.core.block_manager import BlockManager
from cbbench.reference_engine.core.executor import ScheduledChunk
from cbbench.reference_engine.core.sequence import Sequence, SequenceStatus
from cbbench.reference_engine.scheduler.queues import RequestQueue, fcfs_key

_block_table = attrgetter("block_table")
_num_computed = attrgetter("num_computed_tokens")


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)  # preempted in this step
    num_batched_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.chunks


class Scheduler(ABC):
    name: str

    def __init__(self, config: EngineConfig, block_manager: BlockManager, max_model_len: int):
        self.config = config
        self.block_manager = block_manager
        self.max_model_len = max_model_len
        self.waiting = RequestQueue(fcfs_key)
        self.num_preemptions = 0
        # True once the caller said no request will arrive any more (a closed, replayed
        # workload): waiting for a batch to fill can then only waste time
        self.input_closed = False

    # --- bookkeeping the engine drives --------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.add(seq)

    @abstractmethod
    def schedule(self, now: float) -> SchedulerOutput:
        """The next step's chunks. A sequence scheduled for the first time gets
        `metrics.first_scheduled_time = now`."""

    @abstractmethod
    def finish(self, seq: Sequence) -> None:
        """seq just finished (status already FINISHED): release what the policy releases."""

    @abstractmethod
    def abort(self, seq: Sequence) -> None:
        """Remove seq from wherever it is and free its blocks now."""

    @abstractmethod
    def running(self) -> list[Sequence]:
        """Sequences that hold a batch slot and are not finished."""

    def resync(self) -> None:
        """Sequences were advanced without schedule() (the simulator's event skipping): a
        policy that keeps state between steps rebuilds it."""
        return None

    def holders(self) -> list[Sequence]:
        """Every sequence holding KV blocks (static/dynamic: finished members too)."""
        return self.running()

    def next_wakeup(self, now: float) -> float | None:
        """Engine-clock time at which a waiting policy acts without new input (None: it
        acts whenever schedule() is called, or has nothing to do)."""
        return None

    # --- stats --------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running())

    def limit_stats(self) -> dict[str, int]:
        """EngineStats' running limit: fixed at the policy's batch slots (continuous with
        --max-num-seqs auto: the adaptive limit and its decisions, by direction)."""
        return {"num_seqs_limit": self.config.max_batch_slots}

    def reserved_unused_tokens(self) -> int:
        """KV token slots held but not filled by a live sequence's computed tokens."""
        bm = self.block_manager
        # without prefix caching every used block has exactly one holder (check_invariants)
        held = (
            sum(map(len, map(_block_table, self.holders())))
            if bm.enable_prefix_caching
            else bm.num_used_blocks
        )
        return held * bm.block_size - sum(map(_num_computed, self.running()))
