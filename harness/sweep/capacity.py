"""SLO capacity search: the highest request rate at which at least `goodput` of the requests
meet every SLO, found by bracketing (doubling or halving the rate) and then bisection
(geometric midpoints), with repeat runs near the boundary.

Noise on a shared machine only ever makes a level look worse, so a level that misses is run
again (up to `repeats` runs in all) and counts as meeting the SLO when any of its runs does;
passing levels are not repeated, so the repeats land where the misses are: at the boundary
(and at the first rates tried, when those are above it). The answer is the highest
passing rate `lo` with the interval [lo, hi) to the lowest failing one; the search stops once
hi / lo <= 1 + precision, or when the budget of requests or time would be exceeded.

The search only sees `measure(rate, attempt) -> Trial`, so it runs the same against a real
server (`cbbench sweep --find-max-rate`) and against a model in unit tests.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from cbbench.harness.errors import CbbenchError


@dataclass
class Trial:
    rate: float  # offered requests/s
    attempt: int  # 0 = first run at this rate
    goodput_fraction: float | None  # requests meeting every SLO / requests measured
    achieved_rps: float | None = None
    requests: int = 0
    run: str | None = None  # run folder name, when measured on a server

    def meets(self, goodput: float) -> bool:
        return self.goodput_fraction is not None and self.goodput_fraction >= goodput


@dataclass
class CapacityConfig:
    goodput: float = 0.95
    start_rate: float = 1.0
    min_rate: float = 0.01
    max_rate: float = 1000.0
    precision: float = 0.1  # stop when hi / lo <= 1 + precision
    repeats: int = 2  # runs of a missing level (any pass counts)
    requests_per_level: int = 40
    max_requests: int = 1000
    max_time_s: float = 600.0

    def validate(self) -> None:
        if not 0 < self.goodput <= 1:
            raise CbbenchError(f"--goodput must be in (0, 1], got {self.goodput}")
        if not 0 < self.min_rate <= self.start_rate <= self.max_rate:
            raise CbbenchError(
                f"rates must satisfy 0 < min ({self.min_rate}) <= start ({self.start_rate}) "
                f"<= max ({self.max_rate})"
            )
        if self.precision <= 0 or self.repeats < 1 or self.requests_per_level < 1:
            raise CbbenchError("--precision, --repeats and --num-requests must be positive")


@dataclass
class CapacityResult:
    max_rate: float | None  # highest rate that met the SLO (None: not even min_rate)
    interval: tuple[float | None, float | None]  # [passing, failing)
    trials: list[Trial] = field(default_factory=list)
    stopped: str = ""  # why the search ended
    requests: int = 0
    wall_s: float = 0.0

    def to_dict(self) -> dict:
        return {
            "max_rate": self.max_rate,
            "interval": list(self.interval),
            "stopped": self.stopped,
            "requests": self.requests,
            "wall_s": round(self.wall_s, 2),
            "trials": [asdict(t) for t in self.trials],
        }


def find_max_rate(
    measure: Callable[[float, int], Trial],
    cfg: CapacityConfig,
    on_trial: Callable[[Trial], None] | None = None,
) -> CapacityResult:
    cfg.validate()
    t0 = time.monotonic()
    res = CapacityResult(None, (None, None))
    lo: float | None = None
    hi: float | None = None

    def budget_left(runs: int) -> str | None:
        if res.requests + runs * cfg.requests_per_level > cfg.max_requests:
            return f"request budget ({cfg.max_requests}) reached"
        spent = time.monotonic() - t0
        per_run = spent / max(1, len(res.trials))
        if spent + runs * per_run > cfg.max_time_s:
            return f"time budget ({cfg.max_time_s:g} s) reached"
        return None

    def level(rate: float) -> bool | None:
        """Run a level; a miss is repeated (up to `repeats` runs, any pass counts): misses
        happen at the boundary, and one slow moment must not move it. None when the budget
        stops it."""
        for attempt in range(cfg.repeats):
            why = budget_left(1)
            if why:
                res.stopped = why
                return None
            trial = measure(rate, attempt)
            res.trials.append(trial)
            res.requests += trial.requests
            if on_trial:
                on_trial(trial)
            if trial.meets(cfg.goodput):
                return True
        return False

    rate = cfg.start_rate
    while True:  # bracket: double while passing, halve while failing
        ok = level(rate)
        if ok is None:
            break
        if ok:
            lo = rate
            if hi is not None:
                break
            if rate >= cfg.max_rate:
                res.stopped = f"met the SLO at --max-rate {cfg.max_rate:g}"
                break
            rate = min(rate * 2, cfg.max_rate)
        else:
            hi = rate
            if lo is not None:
                break
            if rate <= cfg.min_rate:
                res.stopped = f"missed the SLO even at {cfg.min_rate:g} req/s"
                break
            rate = max(rate / 2, cfg.min_rate)
    while lo is not None and hi is not None and not res.stopped:  # bisect
        if hi / lo <= 1 + cfg.precision:
            res.stopped = f"interval within {cfg.precision:.0%}"
            break
        mid = math.sqrt(lo * hi)
        ok = level(mid)
        if ok is None:
            break
        if ok:
            lo = mid
        else:
            hi = mid
    res.max_rate = lo
    res.interval = (lo, hi)
    res.wall_s = time.monotonic() - t0
    return res
