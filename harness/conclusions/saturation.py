"""Over-saturation: the one rule that `bench` and `sweep` stop a run by.

A server is over-saturated when requests arrive faster than it serves them, so its queue,
and with it every request's wait, grows without bound. Judged on what a run has seen so far
(at least MIN_POINTS completed requests and MIN_SECONDS since t0), any of:

1. **growth** (guidellm's slope test, docs/guides/over_saturation_stopping.md): the
   least-squares slope of TTFT against send time AND of requests in flight against time are
   both above 0 with CONFIDENCE (one-sided Student-t interval on each slope), and the fitted
   TTFT has grown over the span by more than max(MIN_RISE_S, the early median TTFT): a queue
   that grows, not a wobble;
2. **TTFT exploding**: the median TTFT of the last WINDOW requests is more than TTFT_GROWTH x
   that of the first WINDOW, and at least MIN_LATE_TTFT_S;
3. **server queue growing**: the server's own waiting-requests gauge (telemetry), its minimum
   over the last third of the samples at least WAITING_GROWTH x the maximum over the first
   third, and at least MIN_WAITING requests.
and, where the offered rate is known (bench: the schedule), only while the server has served
less than SERVED_SHARE of it so far (the sweep's own "sustained" line, sweep/verdict.py): a
Poisson burst that a server near capacity works off is queueing, not over-saturation.
`bench` stops only once the rule has held at every check (each finished request) for HOLD_S
seconds: a Poisson burst that a busy server works off makes the queue grow for a while (the
slope test's residuals are not independent, so a single check is too eager); a flood keeps
growing. Rules 2 and 3 are the sweep's watch as it was (it judges them alone: a sweep level is short);
rule 1 adds the confidence statement. Closed loops cannot over-saturate (in flight is
capped), so rule 1 needs in flight to grow.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from cbbench.harness.conclusions.stats import t_ppf

WINDOW = 10  # requests compared at the start and the end (rule 2)
TTFT_GROWTH = 5.0  # late median TTFT / early median TTFT that counts as exploding
MIN_LATE_TTFT_S = 0.2  # ... and only when the late median is at least this long
WAITING_GROWTH = 2.0  # server waiting queue: late / early
MIN_WAITING = 8  # ... and at least this many waiting
MIN_POINTS = 30  # completed requests before rule 1 judges
MIN_SECONDS = 5.0  # seconds since t0 before rule 1 judges
CONFIDENCE = 0.99  # one-sided, on each slope
MIN_RISE_S = 0.1  # the fitted TTFT rise over the span that rule 1 needs at least
SERVED_SHARE = 0.9  # served / offered below which a run may be over-saturated
HOLD_S = 5.0  # bench: the rule must hold at every check for this long before a run stops


@dataclass
class Slope:
    value: float  # units of y per second
    low: float  # the lower end of the one-sided CONFIDENCE interval
    n: int


class OnlineSlope:
    """Least-squares slope of y on x from running sums: O(1) per point and per question, so a
    watch that asks after every finished request stays O(n) over a run (x shifted by its first
    value, against cancellation)."""

    def __init__(self) -> None:
        self.n = 0
        self.x0: float | None = None
        self.sx = self.sy = self.sxx = self.sxy = self.syy = 0.0
        self.lo = math.inf  # the x range seen
        self.hi = -math.inf

    def add(self, x: float, y: float) -> None:
        if self.x0 is None:
            self.x0 = x
        self.lo, self.hi = min(self.lo, x), max(self.hi, x)
        x -= self.x0
        self.n += 1
        self.sx += x
        self.sy += y
        self.sxx += x * x
        self.sxy += x * y
        self.syy += y * y

    @property
    def span(self) -> float:
        return self.hi - self.lo if self.n else 0.0

    def slope(self, confidence: float = CONFIDENCE) -> Slope | None:
        n = self.n
        if n < 3:
            return None
        sxx = self.sxx - self.sx * self.sx / n
        if sxx <= 1e-12 * max(1.0, self.sxx):
            return None
        sxy = self.sxy - self.sx * self.sy / n
        syy = self.syy - self.sy * self.sy / n
        b = sxy / sxx
        ssr = max(0.0, syy - b * sxy)
        se = math.sqrt(ssr / (n - 2) / sxx)
        return Slope(b, b - t_ppf(confidence, n - 2) * se, n)


def slope(xs: Sequence[float], ys: Sequence[float], confidence: float = CONFIDENCE) -> Slope | None:
    """Least-squares slope of ys on xs with the lower end of its one-sided t-interval."""
    fit = OnlineSlope()
    for x, y in zip(xs, ys, strict=True):
        fit.add(x, y)
    return fit.slope(confidence)


def growth_verdict(
    ttft: OnlineSlope, in_flight: OnlineSlope, early_ttft_s: float, elapsed_s: float
) -> str | None:
    """Rule 1: `ttft` fits TTFT on send time (completed requests), `in_flight` requests in
    flight on time; `early_ttft_s` is the median TTFT of the first WINDOW requests sent."""
    if ttft.n < MIN_POINTS or elapsed_s < MIN_SECONDS:
        return None
    st, sf = ttft.slope(), in_flight.slope()
    if st is None or sf is None or st.low <= 0 or sf.low <= 0:
        return None
    span = ttft.span
    if st.value * span < max(MIN_RISE_S, early_ttft_s):
        return None
    pct = f"{CONFIDENCE:.0%}"
    fitted_end = early_ttft_s + st.value * span
    return (
        f"queue growing: TTFT from {early_ttft_s * 1e3:.0f} ms to {fitted_end * 1e3:.0f} ms "
        f"(fitted) over {span:.1f} s of sends, its slope above 0 with {pct} confidence "
        f"({st.n} requests), and requests in flight growing {sf.value:.2f}/s (>= "
        f"{sf.low:.2f}/s)"
    )


def ttft_explosion(ttft_s: Sequence[float]) -> str | None:
    """Rule 2 on TTFTs in completion order."""
    if len(ttft_s) < 2 * WINDOW:
        return None
    early = statistics.median(ttft_s[:WINDOW])
    late = statistics.median(ttft_s[-WINDOW:])
    if late >= MIN_LATE_TTFT_S and late > TTFT_GROWTH * max(early, 1e-6):
        return (
            f"TTFT exploding: median of the last {WINDOW} requests {late * 1e3:.0f} ms, "
            f"of the first {WINDOW} {early * 1e3:.0f} ms"
        )
    return None


def waiting_growth(waiting: Sequence[float]) -> str | None:
    """Rule 3 on the server's waiting-requests samples in time order."""
    if len(waiting) < 12:
        return None
    third = len(waiting) // 3
    early, late = max(waiting[:third]), min(waiting[-third:])
    if late >= MIN_WAITING and late >= WAITING_GROWTH * max(early, 1.0):
        return f"server waiting queue growing: {early:.0f} -> {late:.0f} requests"
    return None


def verdict(
    ttft: OnlineSlope, in_flight: OnlineSlope, early_ttft_s: float, ttft_s: Sequence[float],
    waiting: Sequence[float], elapsed_s: float, offered_rps: float | None,
    served_rps: float | None,
) -> str | None:  # fmt: skip
    """The rule (module doc): why the run is over-saturated, or None. `ttft_s`: TTFTs in
    completion order (rule 2), `waiting`: the server's gauge samples (rule 3)."""
    if offered_rps is not None and (served_rps or 0.0) >= SERVED_SHARE * offered_rps:
        return None
    return (
        growth_verdict(ttft, in_flight, early_ttft_s, elapsed_s)
        or (ttft_explosion(ttft_s) if elapsed_s >= MIN_SECONDS else None)
        or waiting_growth(waiting)
    )


def saturation_line(t_s: float, offered_rps: float | None, served_rps: float | None) -> str:
    """The one line a stopped run prints (and run.json keeps)."""
    offered = "?" if offered_rps is None else f"{offered_rps:.1f}"
    served = "?" if served_rps is None else f"{served_rps:.1f}"
    return f"over-saturated at t = {t_s:.1f} s ({offered} req/s offered, {served} served)"


def too_short(arrivals: Sequence[float], served: int, last_end_s: float | None) -> dict:
    """An open loop with too few sends or too short a span for the rule (MIN_POINTS requests,
    MIN_SECONDS of sends): what it offered and what the server served (finished requests over
    first send to last finish), said instead of silence. A burst that a server falls behind
    on is not called over-saturated (it drains once the sends end); that it fell behind is said."""
    span = arrivals[-1] - arrivals[0]
    offered = (len(arrivals) - 1) / span if span > 0 else None  # the rate between sends
    took = (last_end_s - arrivals[0]) if last_end_s is not None else None
    served_rps = served / took if took and took > 0 else None
    line = (f"too short to judge over-saturation: {span:.1f} s of sends ({len(arrivals)} "
            f"requests), the check needs >= {MIN_SECONDS:g} s and >= {MIN_POINTS} requests")  # fmt: skip
    if offered is not None and served_rps is not None:
        line += f"; offered {offered:.1f} req/s, served {served_rps:.1f}"
        if served_rps < SERVED_SHARE * offered:
            line += " (the server fell behind: a longer run at this rate would tell whether it keeps up)"
    return {"sends_s": span, "requests": len(arrivals), "need_s": MIN_SECONDS,
            "need_requests": MIN_POINTS, "offered_rps": offered, "served_rps": served_rps,
            "line": line}  # fmt: skip
