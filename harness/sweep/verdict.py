"""Whether a rate level was sustained, judged from its own requests, and whether it was long
enough to judge at all.

A level of n requests offered at rate r spends (n - 1) / r seconds sending and then drains:
the last requests still run for about one request's latency after the last send. Counting
that drain as part of the window (completed / (arrival span + drain)) makes a short level at a
high rate look like a server that could not keep up, even when the server was idle. So:

- sent rate: (n - 1) / (last send - first send), what the client actually offered;
- achieved rate: (n - 1) / (last end - first send - unloaded latency), the unloaded latency
  being the median E2E latency of the first quarter of the requests (sent before any backlog
  could build): a server that keeps up finishes its last request about one unloaded latency
  after the last send, so the achieved rate equals the sent rate; a backlog makes it lower;
- sustained: achieved >= SUSTAINED x sent rate (and the level was not stopped early);
- too short to judge: fewer than MIN_LEVEL_REQUESTS completed, or a planned arrival span
  ((n - 1) / r, so that the advice holds whatever the draw) shorter than SPAN_LATENCIES
  unloaded latencies (the drain then dominates the window, and one long
  request moves the verdict). The verdict says how many requests the level needed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from cbbench.harness.results.records import RequestRecord

SUSTAINED = 0.9  # achieved / sent rate above which a rate level is sustained
MIN_LEVEL_REQUESTS = 20  # completed requests below which no level is judged
SPAN_LATENCIES = 3.0  # arrival span / unloaded latency below which a level is too short


@dataclass
class LevelVerdict:
    completed: int
    sent_rps: float | None  # what the client offered (actual sends)
    achieved_rps: float | None  # drain-corrected completion rate
    unloaded_e2e_s: float | None  # median E2E of the first quarter of the requests
    needed_requests: int | None  # requests a level at this rate needs to be judged
    sustained: bool | None  # None: too short to judge
    too_short: str | None  # why it could not be judged

    def to_dict(self) -> dict:
        return asdict(self)


def needed_requests(rate: float, unloaded_e2e_s: float) -> int:
    """Requests whose arrival span at `rate` covers SPAN_LATENCIES unloaded latencies."""
    return max(MIN_LEVEL_REQUESTS, math.ceil(SPAN_LATENCIES * rate * unloaded_e2e_s) + 1)


def judge_level(records: Sequence[RequestRecord], rate: float) -> LevelVerdict:
    """The verdict of one open-loop level at `rate` requests/s."""
    ok = sorted(
        (r for r in records if r.ok and not r.warmup and r.sent_s is not None and r.end_s),
        key=lambda r: r.sent_s,
    )
    n = len(ok)
    if n < 2:
        why = f"{n} completed request{'s' if n != 1 else ''}; needs at least {MIN_LEVEL_REQUESTS}"
        return LevelVerdict(n, None, None, None, MIN_LEVEL_REQUESTS, None, why)
    first_sent, last_sent = ok[0].sent_s, ok[-1].sent_s
    span = last_sent - first_sent
    early = [r.e2e_s for r in ok[: max(1, n // 4)] if r.e2e_s is not None]
    unloaded = statistics.median(early) if early else 0.0
    window = max(r.end_s for r in ok) - first_sent - unloaded
    sent = (n - 1) / span if span > 0 else None
    achieved = (n - 1) / window if window > 0 else None
    need = needed_requests(rate, unloaded)
    too_short = None
    planned_span = (n - 1) / rate  # not the drawn span: the advice must hold for any draw
    if n < MIN_LEVEL_REQUESTS or planned_span < SPAN_LATENCIES * unloaded:
        too_short = (
            f"too short to judge: {n} requests at {rate:g}/s arrive over {planned_span:.2f} s, "
            f"less than {SPAN_LATENCIES:g}x the unloaded latency {unloaded:.2f} s"
            if n >= MIN_LEVEL_REQUESTS
            else f"too short to judge: {n} completed requests"
        ) + f"; needs --num-requests {need} or more"
    sustained = None
    if too_short is None:
        sustained = sent is not None and achieved is not None and achieved >= SUSTAINED * sent
    return LevelVerdict(n, sent, achieved, unloaded, need, sustained, too_short)
