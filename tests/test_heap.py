"""The collector during a measured phase (harness/load/heap.py): the heap is frozen at start and
again after each full collection, young objects are still collected, and stop puts back the
collector as it was."""

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
        assert gc.collect(0) >= 1
        assert gc.get_freeze_count() == frozen
    finally:
        heap.stop()
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
    heap.stop()  # twice: nothing to undo
