"""The continuous scheduler's running sequences, kept in rank order between steps.

A decode step changes little: every running sequence computes one token, and only the ones
whose next token crosses into a new KV block need anything but the same one-token chunk as
last step. So the batch keeps, across steps,
- the sequences sorted by rank (and the ranks, for bisection): joins and leaves are a
  bisect plus a memmove, never a re-sort;
- each sequence's plain decode chunk (one token, no lookahead), made once when it joins and
  handed out again every step it decodes (its content never changes: `start` and `samples`
  read the sequence);
- when each sequence must next be looked at: a sequence that got a plain chunk with `room`
  free slots left in its blocks is due `room + 1` steps later (it gains at most one token a
  step until then); one that got anything else (a prefill chunk) is due next step.
A step then looks at the due sequences only: O(changes), not O(running). (The output list is
still a copy of `plain`, a memcpy of n pointers.)

The due steps are counted in `schedule()` calls. A call whose chunks were not applied only
makes the estimate early (a look that finds nothing to do). Whoever advances sequences
without a `schedule()` (the simulator's event skipping) calls `resync()`: the next step
then takes the full loop, which rebuilds the due steps.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from cbbench.reference_engine.core.executor import ScheduledChunk
from cbbench.reference_engine.core.sequence import Sequence

GAP = 1 << 20  # between the order labels of neighbours when (re)labelled


class RunningBatch:
    def __init__(self) -> None:
        self.rank: dict[Sequence, tuple] = {}  # insertion order: running()'s order
        self.order: list[Sequence] = []  # by rank, most important first
        self._ranks: list[tuple] = []  # = [rank[s] for s in order] (ranks are unique)
        self.plain: list[ScheduledChunk] = []  # = [ScheduledChunk(s, 1) for s in order]
        # ints increasing along `order`: sorting a few sequences by rank compares ints
        self.label: dict[Sequence, int] = {}
        self._labels: list[int] = []  # = [label[s] for s in order]
        self._due: dict[int, list[Sequence]] = {}  # tick -> sequences to look at then
        # seq -> the tick it is due: every running sequence is in exactly one of the lists
        # (once looked at, until it is given its next look), so a leaver leaves its list
        self._when: dict[Sequence, int] = {}
        self.tick = 0  # schedule() calls so far
        self.synced = False  # the due steps cover every running sequence

    def __len__(self) -> int:
        return len(self.rank)

    def __contains__(self, seq: Sequence) -> bool:
        return seq in self.rank

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self.rank)

    def add(self, seq: Sequence, rank: tuple) -> None:
        assert seq not in self.rank, f"{seq.request_id} running twice"
        i = bisect.bisect_left(self._ranks, rank)
        labels = self._labels
        lo = labels[i - 1] if i else 0
        hi = labels[i] if i < len(labels) else lo + 2 * GAP
        if hi - lo < 2:  # no room between the neighbours: relabel everyone
            labels[:] = range(GAP, GAP * (len(labels) + 1), GAP)
            self.label = dict(zip(self.order, labels, strict=True))
            lo = labels[i - 1] if i else 0
            hi = labels[i] if i < len(labels) else lo + 2 * GAP
        label = (lo + hi) // 2
        self.rank[seq] = rank
        self.label[seq] = label
        self.order.insert(i, seq)
        self._ranks.insert(i, rank)
        labels.insert(i, label)
        self.plain.insert(i, ScheduledChunk(seq, 1))
        self.look_at(seq, 1)

    def remove(self, seq: Sequence) -> None:
        i = self.index(seq)
        pending = self._due.get(self._when.pop(seq))
        if pending is not None:  # (not when it is being looked at in this very step)
            pending.remove(seq)
        del self.rank[seq], self.label[seq]
        del self.order[i], self._ranks[i], self._labels[i], self.plain[i]

    def index(self, seq: Sequence) -> int:
        i = bisect.bisect_left(self._labels, self.label[seq])
        assert self.order[i] is seq
        return i

    # --- when to look at a sequence again ---------------------------------------------
    def look_at(self, seq: Sequence, steps: int) -> None:
        """Look at seq again `steps` schedule() calls from now (>= 1), and not before."""
        tick = self.tick + steps
        self._when[seq] = tick
        due = self._due.get(tick)
        if due is None:
            self._due[tick] = [seq]
        else:
            due.append(seq)

    def look_at_each(self, seqs: list[Sequence], steps: list[int]) -> None:
        """look_at(seq, n) for each pair (a step's due sequences: no call per sequence)."""
        tick = self.tick
        when = self._when
        due = self._due
        for seq, n in zip(seqs, steps, strict=True):
            t = tick + n
            when[seq] = t
            later = due.get(t)
            if later is None:
                due[t] = [seq]
            else:
                later.append(seq)

    def next_tick(self) -> list[Sequence]:
        """Start a step: the running sequences due now, in rank order."""
        self.tick = tick = self.tick + 1
        due = self._due.pop(tick, None)
        if not due:
            return []
        due.sort(key=self.label.__getitem__)  # one entry per running sequence
        return due

    def resync(self, looks: list[tuple[Sequence, int]] | None = None) -> None:
        """Forget the due steps; with `looks` (every running sequence, steps from now),
        rebuild them from a full pass."""
        self._due = {}
        self._when = dict.fromkeys(self.rank, 0)
        self.synced = looks is not None
        for seq, steps in looks or ():
            self.look_at(seq, steps)
