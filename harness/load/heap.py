"""The cyclic garbage collector during a measured phase.

A run keeps what it built and what it measured: the plan, the requests built ahead, and a
record (with its lists) for every finished request. CPython's full collections scan every
tracked object again and again as that heap grows: ~6 % of the client's CPU at ~7,000
requests a second, and in bursts the timing sees. So the heap is frozen (`gc.freeze`) before
t0, and again after each collection the run triggers: what survived one is live, and no
later collection need scan it again; young objects are still collected as usual. Frozen objects are still freed by reference counting; only a cycle
frozen while in use (a request in flight at that moment) waits for the run's end, when the
heap is unfrozen. The client makes almost no cyclic garbage (a 1,024-stream run: 10 objects
found by its middle collections, 64 by its full ones), so that costs nothing.

Freezing after the middle collections too (#57, 6 December 2026) leaves the full ones
next to nothing to scan: a full collection used to scan every middle-collection survivor
since the last freeze (the full collections before t0 of a 4,096-stream worker took 22-63 ms
of CPU each, on the loop; one in a measured phase would be longer than a token gap). A
middle collection itself still scanned up to ten young collections' survivors (7-42 ms of
CPU measured at 1,024-4,096 streams in flight, once every few seconds; 66 ms each in the
selftest's 32-stream closed loop, whose records pile up at ~7,000 a second).

So the survivors of every collection, young ones included, are frozen (#57, s57): each
object is scanned once, by the young collection it survives, and a middle collection has
nothing left to scan. The collector's share of a selftest run's CPU went from 3.9 % (30
young collections of ~4.5 ms, 2 middle ones of ~66 ms) to the young collections alone.
"""

from __future__ import annotations

import gc

YOUNG = 10_000  # allocations between young collections (CPython's default: 700)


def _refreeze(phase: str, info: dict) -> None:
    if phase == "stop":
        gc.freeze()


class FrozenHeap:
    """`start()` before t0 (collects, then freezes), `stop()` when the run ends."""

    def __init__(self, young: int = YOUNG) -> None:
        self.active = False
        self.young = young
        self._thresholds = gc.get_threshold()

    def start(self) -> None:
        assert not self.active
        gc.collect()
        gc.freeze()
        gc.callbacks.append(_refreeze)
        self._thresholds = gc.get_threshold()
        gc.set_threshold(self.young, *self._thresholds[1:])
        self.active = True

    def stop(self) -> None:
        if not self.active:
            return
        self.active = False
        if _refreeze in gc.callbacks:
            gc.callbacks.remove(_refreeze)
        gc.set_threshold(*self._thresholds)
        gc.unfreeze()
