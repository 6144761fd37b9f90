"""Which unit a Locust user runs next, with no unit sent twice across workers.

A *unit* is a multi-turn session's turns (in turn order, `sessions.group_sessions`) or one
request. The workload becomes a sequence of *positions*: position p is unit `order[p % u]`
of lap `p // u` (laps only with `cycle`). In schedule mode `order` sorts the units by their
first turn's arrival and a position is due at `lap * span + arrival` seconds after t0 (plus
the epoch's shift); later turns follow their previous reply and think time, so they have no
due time of their own. In closed loop `order` is the workload order and nothing is due. A
process that holds slot `k` of `of` takes positions `base + k, base + k + of, ...`, so the
master's slots partition the units among workers (a session stays with one user). A later
epoch (the test restarted from the web UI) starts at a `base` past every position handed out
before, so indices never repeat within a run folder. A record's `index` is
`lap * n + RequestSpec.index` (n requests a lap).
"""

from __future__ import annotations

from dataclasses import dataclass

from cbbench.harness.load.sessions import group_sessions
from cbbench.workloads.spec import RequestSpec, Workload


@dataclass(frozen=True)
class Ticket:
    position: int
    lap: int
    turns: tuple[RequestSpec, ...]  # a session's turns in order, or one request
    offset: int  # lap * n: a turn's record index is offset + spec.index (unique in the run)
    due_s: float | None  # seconds from t0 when the first turn should be sent; None = at once

    def index_of(self, spec: RequestSpec) -> int:
        return self.offset + spec.index

    def session_id(self, spec: RequestSpec) -> str | None:
        """A session's id in the run: a later lap of `--cycle` runs it again, as another
        session."""
        sid = spec.session_id
        return sid if sid is None or not self.lap else f"{sid}#{self.lap}"

    @property
    def index(self) -> int:
        """The first turn's record index."""
        return self.index_of(self.turns[0])


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
        units = [tuple(u) for u in group_sessions(workload.requests)]
        if schedule:
            units.sort(key=lambda u: (u[0].arrival_s or 0.0, u[0].index))
        self.order: tuple[tuple[RequestSpec, ...], ...] = tuple(units)
        self.n = len(workload)  # requests a lap
        self.units = len(units)
        self._pos_of_index = {r.index: p for p, u in enumerate(units) for r in u}
        assert len(self._pos_of_index) == self.n, "request indices must be unique"
        times = [u[0].arrival_s or 0.0 for u in units]
        gap = (times[-1] - times[0]) / (self.units - 1) if self.units > 1 else 1.0
        self.span = times[-1] + gap  # one lap of the schedule, for cycling
        self.plan: Plan | None = None
        self._round = 0
        self.taken_max = -1  # highest position handed out, over every epoch
        self.taken = 0

    def due_raw(self, position: int) -> float:
        lap, i = divmod(position, self.units)
        return lap * self.span + (self.order[i][0].arrival_s or 0.0)

    def position_of(self, index: int) -> int:
        """The position of the unit that a record index belongs to."""
        lap, i = divmod(index, self.n)
        return lap * self.units + self._pos_of_index[i]

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
        return (
            p is not None and not self.cycle and p.base + self._round * p.of + p.slot >= self.units
        )

    def take(self) -> Ticket | None:
        p = self.plan
        if p is None or self.exhausted:
            return None
        position = p.base + self._round * p.of + p.slot
        self._round += 1
        self.taken += 1
        self.taken_max = max(self.taken_max, position)
        lap, i = divmod(position, self.units)
        due = self.due_raw(position) + p.shift_s if self.schedule else None
        return Ticket(position, lap, self.order[i], lap * self.n, due)
