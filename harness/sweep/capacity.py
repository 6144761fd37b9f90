"""SLO capacity search: the highest request rate at which at least `goodput` of the requests
meet every SLO, found by bracketing (doubling or halving the rate) and then bisection
(geometric midpoints), with repeat runs near the boundary.

Only levels it can judge count (harness/sweep/capacity_level.py): a level too short to
judge is run again with the requests it needs (up to the budget); one that still cannot be
judged ends the search, saying what it needs; it never counts as met.

The rule over repeats (REPEAT_RULE): noise on a shared machine only ever makes a level look
worse, so a level whose first run meets the SLO is met; a level whose first run misses is run
again, up to `repeats` runs in all, and is met when a majority of those runs meet it
(`repeats` 3: 2 of 3). The answer is the highest met rate `lo` with the interval [lo, hi) to
the lowest missed one; the search stops once hi / lo <= 1 + precision, or when the budget of
requests or time would be exceeded. The answer is never above the highest rate the server
served in any level (Trial.achieved_rps, verdict.py's completions per second): it is capped
there, and `stopped` says so.

A level is judged by the load it actually offered (Trial.offered_rps: requests sent / send
span): a met run that offered less than (1 - OFFERED_TOLERANCE) of its nominal rate (a low
Poisson draw, sends lagging their schedule) is "met at X req/s offered (below the Y/s
level)", and the answer credits that level only with the highest rate its met runs offered
(`offered` in to_dict says so). The tolerance is the search's default precision: a shortfall
under it moves the answer by less than the search claims to resolve.

The search only sees `measure(rate, attempt, requests) -> Trial`, so it runs the same against
a real server (`cbbench sweep --find-max-rate`) and against a model in unit tests.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from cbbench.harness.errors import CbbenchError

REPEAT_RULE = "a level is met when its first run is, else when most of its runs are"
OFFERED_TOLERANCE = 0.10  # a met run offering less than 90 % of its level's rate is credited at
# what it offered (module docstring)


@dataclass
class Trial:
    rate: float  # offered requests/s
    attempt: int  # 0 = first run at this rate
    goodput_fraction: float | None  # requests meeting every SLO / requests that finished
    achieved_rps: float | None = None  # served: completions/s (verdict.py)
    requests: int = 0
    run: str | None = None  # run folder name, when measured on a server
    state: str | None = None  # met | missed | undecided (capacity_level); None: by goodput
    why: str = ""  # what decided the state
    needed_requests: int | None = None  # undecided: the requests a level here needs
    offered_rps: float | None = None  # sent: requests sent / send span; None: not measured
    timing_note: str | None = None  # the timing error bound could flip this verdict

    def short_offer(self) -> str | None:
        """'met at X req/s offered (below the Y/s level)' when this run offered less than
        (1 - OFFERED_TOLERANCE) of its rate; None when it offered the level (or unmeasured)."""
        if self.offered_rps is None or self.offered_rps >= (1 - OFFERED_TOLERANCE) * self.rate:
            return None
        return f"met at {self.offered_rps:.3g} req/s offered (below the {self.rate:.4g}/s level)"

    def verdict(self, goodput: float) -> str:
        if self.state is not None:
            return self.state
        ok = self.goodput_fraction is not None and self.goodput_fraction >= goodput
        return "met" if ok else "missed"

    def meets(self, goodput: float) -> bool:
        return self.verdict(goodput) == "met"


@dataclass
class CapacityConfig:
    goodput: float = 0.95
    start_rate: float = 1.0
    min_rate: float = 0.01
    max_rate: float = 1000.0
    precision: float = 0.1  # stop when hi / lo <= 1 + precision
    repeats: int = 3  # runs of a level whose first run missed (REPEAT_RULE)
    requests_per_level: int = 40
    max_requests: int = 1000
    max_time_s: float = 600.0
    queue_bound_s: float | None = None  # the SLO's TTFT (else E2E) bound: sizes each level

    def first_size(self, rate: float) -> int:
        """Requests of a level's first run: --num-requests, or more where the arrival span a
        queue needs to show at this rate (verdict.QUEUE_SPAN x the bound) asks for more: known
        before the run, so no run too short by that rule is spent."""
        if not self.queue_bound_s:
            return self.requests_per_level
        from cbbench.harness.sweep.verdict import QUEUE_SPAN

        span = math.ceil(QUEUE_SPAN * self.queue_bound_s * rate - 1e-9) + 1
        return max(self.requests_per_level, span)

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
    undecided: str | None = None  # the level it could not judge, and what that needs
    offered: dict | None = None  # the answer level's met runs offered below it (docstring)

    def to_dict(self) -> dict:
        return {
            "max_rate": self.max_rate,
            "interval": list(self.interval),
            "stopped": self.stopped,
            "undecided": self.undecided,
            "offered": self.offered,
            "rule": REPEAT_RULE,
            "requests": self.requests,
            "wall_s": round(self.wall_s, 2),
            "trials": [asdict(t) for t in self.trials],
        }


def find_max_rate(
    measure: Callable[[float, int, int], Trial],
    cfg: CapacityConfig,
    on_trial: Callable[[Trial], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> CapacityResult:
    cfg.validate()
    t0 = clock()
    res = CapacityResult(None, (None, None))
    lo: float | None = None
    hi: float | None = None

    overhead = [0.0]  # the most any run took beyond its arrival span (start-up, drain)

    def budget_left(rate: float, requests: int) -> str | None:
        if res.requests + requests > cfg.max_requests:
            return f"request budget ({cfg.max_requests}) reached"
        if clock() - t0 + level_seconds(rate, requests) > cfg.max_time_s:
            return f"time budget ({cfg.max_time_s:g} s) reached"
        return None

    def level_seconds(rate: float, requests: int) -> float:
        """A run's time: its arrivals at the rate (at most the most served yet: a queue past
        it drains at the server's pace) plus the largest overhead seen. Not the seconds per
        request so far: slow low-rate levels made a short fast one look too long to run."""
        served = [t.achieved_rps for t in res.trials if t.achieved_rps]
        pace = min(rate, max(served)) if served else rate
        return requests / pace + overhead[0]

    def run(rate: float, attempt: int, n: int) -> Trial:
        start = clock()
        trial = measure(rate, attempt, n)
        wall = clock() - start
        overhead[0] = max(overhead[0], wall - trial.requests / rate)
        return trial

    def level(rate: float) -> bool | None:
        """Met (True) or missed (False) by REPEAT_RULE over the runs it can judge; a run too
        short to judge is run again, longer. None: the search stops (budget, or a level it
        cannot judge: `res.undecided` says what it needs)."""
        need = cfg.repeats // 2 + 1
        met = missed = attempt = 0
        n = cfg.first_size(rate)
        while True:
            why = budget_left(rate, n)
            if why:
                res.stopped = why
                if met + missed:  # judged, but the rule asks another run: say so
                    res.undecided = (
                        f"rate {rate:.4g}/s: {missed} of {met + missed} runs missed the SLO; "
                        f"the repeat that decides it ({n} requests) is more than the budget "
                        f"leaves; raise --max-requests or --max-time"
                    )
                elif n > cfg.requests_per_level:  # it was lengthening: say for what
                    res.undecided = (
                        f"rate {rate:.4g}/s: a level there needs {n} requests to be judged, "
                        f"more than the budget leaves; raise --max-requests or --max-time"
                    )
                return None
            trial = run(rate, attempt, n)
            res.trials.append(trial)
            res.requests += trial.requests
            if on_trial:
                on_trial(trial)
            state = trial.verdict(cfg.goodput)
            if state == "undecided":
                wanted = trial.needed_requests
                if wanted is not None and wanted > n:
                    n = wanted  # lengthened: the same run again, long enough to judge
                    continue
                res.undecided = f"rate {rate:.4g}/s: {trial.why or 'could not be judged'}"
                res.stopped = "cannot decide"
                return None
            if state == "met" and attempt == 0:
                return True  # noise only hurts: a first pass needs no confirmation
            met += state == "met"
            missed += state != "met"
            if met >= need:
                return True
            if missed > cfg.repeats - need:
                return False
            attempt += 1

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
    if lo is not None:
        lo = credit_offered(res, lo, cfg.goodput)
    peak = max((t.achieved_rps for t in res.trials if t.achieved_rps), default=None)
    if lo is not None and peak is not None and lo > peak:  # never above what was served
        res.stopped += (
            f"; capped at {peak:.3g} req/s, the most the server served in any level "
            f"(the met rate was {lo:.4g}/s)"
        )
        lo = peak
    res.max_rate = lo
    res.interval = (lo, hi)
    res.wall_s = clock() - t0
    return res


def credit_offered(res: CapacityResult, lo: float, goodput: float) -> float:
    """The answer credited by the load actually offered (module docstring): each met level
    counts at its rate, or at the most its met runs offered when all of them fell more than
    OFFERED_TOLERANCE short of it; the answer is the highest of those, at most `lo`."""
    met: dict[float, list[Trial]] = {}
    for t in res.trials:
        if t.rate <= lo and t.meets(goodput):
            met.setdefault(t.rate, []).append(t)
    if lo not in met:
        return lo
    credit: dict[float, float] = {}
    for rate, runs in met.items():
        short = [t for t in runs if t.short_offer()]
        credit[rate] = rate if len(short) < len(runs) else max(t.offered_rps or 0 for t in short)
    if credit[lo] >= lo:
        return lo
    best = max(credit.values())
    res.offered = {
        "level": lo,
        "offered_rps": credit[lo],
        "tolerance": OFFERED_TOLERANCE,
        "answer": best,
    }
    res.stopped += (
        f"; met at {credit[lo]:.3g} req/s offered (below the {lo:.4g}/s level: its sends fell "
        f"more than {OFFERED_TOLERANCE:.0%} short), so the answer is the most offered by met "
        f"runs, {best:.3g} req/s"
    )
    return best
