"""Which request a Locust user sends next, with no request sent twice across workers.

The workload becomes a sequence of *positions*: position p is request `order[p % n]` of lap
`p // n` (laps only with `cycle`). In schedule mode `order` sorts by arrival time and a
position is due at `lap * span + arrival` seconds after t0 (plus the epoch's shift); in closed
loop it is the workload order and nothing is due. A process that holds slot `k` of `of` takes
positions `base + k, base + k + of, base + k + 2 * of, ...`, so the master's slots partition
the positions among workers. A later epoch (the test restarted from the web UI) starts at a
`base` past every position handed out before, so indices never repeat within a run folder.
A record's `index` is `lap * n + RequestSpec.index`.
"""

from __future__ import annotations

from dataclasses import dataclass

from cbbench.workloads.spec import RequestSpec, Workload


@dataclass(frozen=True)
class Ticket:
    position: int
    index: int  # record index: lap * n + spec.index (unique within the run)
    lap: int
    spec: RequestSpec
    due_s: float | None  # seconds from t0 when it should be sent; None = as soon as taken


@dataclass(frozen=True)
class Plan:
    """One epoch's share of the positions for one process."""

    slot: int
    of: int
    base: int = 0
    shift_s: float = 0.0  # added to every due time (restarted schedules start now)

    def __post_init__(self) -> None:
        assert 0 <= self.slot < self.of and self.base >= 0, self


class Dispenser:
    def __init__(self, workload: Workload, schedule: bool, cycle: bool = False) -> None:
        assert len(workload) > 0, "empty workload"
        self.schedule = schedule
        self.cycle = cycle
        reqs = list(workload.requests)
        if schedule:
            reqs.sort(key=lambda r: (r.arrival_s or 0.0, r.index))
        self.order: tuple[RequestSpec, ...] = tuple(reqs)
        self.n = len(reqs)
        self._pos_of_index = {r.index: p for p, r in enumerate(reqs)}
        assert len(self._pos_of_index) == self.n, "request indices must be unique"
        times = [r.arrival_s or 0.0 for r in reqs]
        gap = (times[-1] - times[0]) / (self.n - 1) if self.n > 1 else 1.0
        self.span = times[-1] + gap  # one lap of the schedule, for cycling
        self.plan: Plan | None = None
        self._round = 0
        self.taken_max = -1  # highest position handed out, over every epoch
        self.taken = 0

    def due_raw(self, position: int) -> float:
        lap, i = divmod(position, self.n)
        return lap * self.span + (self.order[i].arrival_s or 0.0)

    def position_of(self, index: int) -> int:
        lap, i = divmod(index, self.n)
        return lap * self.n + self._pos_of_index[i]

    def assign(self, plan: Plan) -> None:
        self.plan = plan
        self._round = 0

    def close(self) -> None:
        self.plan = None

    @property
    def is_open(self) -> bool:
        return self.plan is not None

    @property
    def exhausted(self) -> bool:
        """No position left for this process (never with `cycle`)."""
        p = self.plan
        return p is not None and not self.cycle and p.base + self._round * p.of + p.slot >= self.n

    def take(self) -> Ticket | None:
        p = self.plan
        if p is None or self.exhausted:
            return None
        position = p.base + self._round * p.of + p.slot
        self._round += 1
        self.taken += 1
        self.taken_max = max(self.taken_max, position)
        lap, i = divmod(position, self.n)
        spec = self.order[i]
        due = self.due_raw(position) + p.shift_s if self.schedule else None
        return Ticket(position, lap * self.n + spec.index, lap, spec, due)
