"""The collector during a measured phase (harness/load/heap.py): the heap is frozen at start and
again after each collection (survivors are live), young garbage is still collected, and stop puts
back the collector as it was."""

import gc

from cbbench.harness.load.heap import FrozenHeap


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_frozen_during_the_run_and_restored_after():
    before = gc.get_threshold()
    heap = FrozenHeap(young=5000)
    heap.start()
    try:
        assert gc.get_freeze_count() > 0 and gc.get_threshold()[0] == 5000
        kept = [_Cycle() for _ in range(10)]  # live: survive a full collection, then frozen
        gc.collect()
        frozen = gc.get_freeze_count()
        assert all(gc.is_tracked(c) for c in kept)
        _Cycle()  # garbage made after that: still found by a collection
        young = [_Cycle() for _ in range(10)]  # live: survive a young collection, then frozen
        assert gc.collect(0) >= 1
        assert gc.get_freeze_count() >= frozen + len(young)
        assert gc.collect(1) == 0  # the middle collection finds nothing left to scan
    finally:
        heap.stop()
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
    heap.stop()  # twice: nothing to undo


def test_survivors_of_a_middle_collection_are_frozen_too():
    """What survives a generation-1 collection is live: frozen at once, so the run's full
    collections find nothing new to scan (they cost ~33 ms at 1,024 streams before)."""
    heap = FrozenHeap(young=5000)
    heap.start()
    try:
        frozen = gc.get_freeze_count()
        kept = [_Cycle() for _ in range(100)]
        gc.collect(1)
        assert gc.get_freeze_count() >= frozen + len(kept)
        _Cycle()  # garbage made after that: still found by a young collection
        assert gc.collect(0) >= 1
    finally:
        heap.stop()
    assert gc.get_freeze_count() == 0
