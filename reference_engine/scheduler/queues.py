"""Waiting queues: FCFS, and priority with aging.

Priority with aging: a request's effective priority is `priority - aging_rate * waited_s`.
Because every waiting request ages at the same rate, the order by effective priority equals
the order by the static key `priority + aging_rate * arrival_time`, so a sorted list works.
A request can only be overtaken by later arrivals that beat that key, hence its wait is
bounded by (its priority - the best priority) / aging_rate plus the service time ahead.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator

from cbbench.reference_engine.core.sequence import Sequence

SortKey = tuple[float, ...]


def fcfs_key(seq: Sequence) -> SortKey:
    return (seq.metrics.arrival_time, seq.seq_index)


def priority_key(aging_rate: float) -> Callable[[Sequence], SortKey]:
    def key(seq: Sequence) -> SortKey:
        arrival = seq.metrics.arrival_time
        return (seq.priority + aging_rate * arrival, arrival, seq.seq_index)

    return key


class RequestQueue:
    """Sequences ordered by `key` (smallest first); O(log n) search, O(n) memmove insert."""

    def __init__(self, key: Callable[[Sequence], SortKey]) -> None:
        self.key = key
        self._items: list[tuple[SortKey, Sequence]] = []
        self._keys: dict[Sequence, SortKey] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[Sequence]:
        return (s for _, s in list(self._items))

    def __contains__(self, seq: Sequence) -> bool:
        return seq in self._keys

    def add(self, seq: Sequence) -> None:
        assert seq not in self._keys, f"{seq.request_id} queued twice"
        k = self.key(seq)
        self._keys[seq] = k
        bisect.insort(self._items, (k, seq), key=lambda item: item[0])

    def remove(self, seq: Sequence) -> None:
        k = self._keys.pop(seq)
        i = bisect.bisect_left(self._items, k, key=lambda item: item[0])
        assert self._items[i][1] is seq
        del self._items[i]

    def peek(self) -> Sequence:
        return self._items[0][1]

    def pop(self) -> Sequence:
        _, seq = self._items.pop(0)
        del self._keys[seq]
        return seq

    def oldest(self) -> Sequence | None:
        """The earliest arrival (the head for FCFS)."""
        if not self._items:
            return None
        return min((s for _, s in self._items), key=fcfs_key)
