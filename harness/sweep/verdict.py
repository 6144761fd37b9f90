"""Whether a rate level was sustained, judged from its own requests, and whether it was long
enough to judge at all.

A level of n requests offered at rate r spends (n - 1) / r seconds sending and then drains:
the last requests still run for about one request's latency after the last send. Counting
that drain as part of the window (completed / (arrival span + drain)) makes a short level at a
high rate look like a server that could not keep up, even when the server was idle. So:

- sent rate: (n - 1) / (last send - first send), what the client actually offered;
- achieved rate: (n - 1) / (arrival span + backlog), the backlog being how much later the
  level's last request ended than any request would have with no queue: its send time plus
  its unloaded latency (the TTFT of the first quarter of the requests, sent before a backlog
  could build, then the level's TPOT per output token, so that a long request finishing last
  is not taken for a backlog). A server that keeps up has no backlog, so the achieved rate
  equals the sent rate; one that falls behind finishes later and later;
- sustained: achieved >= SUSTAINED x sent rate (and the level was not stopped early);
- too short to judge: fewer than MIN_LEVEL_REQUESTS completed, or a planned arrival span
  ((n - 1) / r, so that the advice holds whatever the draw) shorter than SPAN_LATENCIES
  unloaded latencies (the drain then dominates the window, and one long
  request moves the verdict), or a level that looks sustained but whose span is shorter than
  STEADY_LATENCIES of its own (loaded) latencies (one to fill up, one at a steady state): by
  Little's law it holds rate x latency requests in flight there, and it ended before (a
  continuous batcher takes 40 requests at 17/s into one batch and keeps its TTFT low, then
  misses at 400). The verdict says how many requests the level needed.
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
STEADY_LATENCIES = 2.0  # ... / its own latency: one to fill up to a steady state, one in it


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


def _median(values) -> float | None:
    v = [x for x in values if x is not None]
    return statistics.median(v) if v else None


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
    early = ok[: max(1, n // 4)]
    unloaded = _median([r.e2e_s for r in early]) or 0.0
    ttft_ref = _median([r.ttft_s for r in early])
    tpot = _median([r.tpot_s for r in ok])  # the level's own: batching legitimately raises it

    def expected(r: RequestRecord) -> float:
        """A request's latency with no backlog: the early TTFT, then the level's TPOT per
        token (so a long request finishing last is not taken for a backlog)."""
        if ttft_ref is None or tpot is None:
            return unloaded
        tokens = r.output_tokens_server or r.output_tokens_client or 1
        return ttft_ref + (tokens - 1) * tpot

    # the time the server needed beyond every request's own unloaded latency: the backlog
    backlog = max(0.0, max(r.end_s for r in ok) - max(r.sent_s + expected(r) for r in ok))
    sent = (n - 1) / span if span > 0 else None
    achieved = (n - 1) / (span + backlog) if span + backlog > 0 else None
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
    loaded = _median([r.e2e_s for r in ok]) or 0.0  # the level's own latency
    if sustained and planned_span < STEADY_LATENCIES * loaded:  # ended before a steady state
        need = max(need, math.ceil(STEADY_LATENCIES * rate * loaded) + 1)
        too_short = (
            f"too short to judge: {n} requests at {rate:g}/s arrive over {planned_span:.2f} s, "
            f"less than {STEADY_LATENCIES:g}x the level's own latency {loaded:.2f} s (median "
            f"E2E): it ended before reaching a steady state ({rate * loaded:.0f} in flight); "
            f"needs --num-requests {need} or more"
        )
        sustained = None
    return LevelVerdict(n, sent, achieved, unloaded, need, sustained, too_short)


def judge_closed_level(records: Sequence[RequestRecord], concurrency: int) -> LevelVerdict:
    """A closed-loop level at `concurrency` is too short to judge when fewer than
    MIN_LEVEL_REQUESTS completed, or when each slot served fewer than SPAN_LATENCIES
    requests: the ramp-up (every slot starting at once) and the drain (slots emptying one by
    one) are then most of the window. `sustained` stays None: a closed loop offers no rate."""
    ok = [r for r in records if r.ok and not r.warmup and r.end_s]
    n = len(ok)
    need = max(MIN_LEVEL_REQUESTS, math.ceil(SPAN_LATENCIES * concurrency))
    too_short = None
    if n < need:
        per_slot = n / concurrency
        too_short = (
            f"too short to judge: {n} completed requests"
            + (f", {per_slot:.1f} per slot of {concurrency}" if n >= MIN_LEVEL_REQUESTS else "")
            + f"; needs --num-requests {need} or more"
        )
    return LevelVerdict(n, None, None, None, need, None, too_short)
