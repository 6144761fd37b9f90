"""Whether a rate level was sustained, judged from its own requests, and whether it was long
enough to judge at all.

A level of n requests offered at rate r spends (n - 1) / r seconds sending and then drains:
the last requests still run for about one request's latency after the last send. Counting
that drain as part of the window (completed / (arrival span + drain)) makes a short level at a
high rate look like a server that could not keep up, even when the server was idle. So:

- sent rate: (n - 1) / (last send - first send), what the client actually offered;
- served rate (`achieved_rps`): what the server delivered, completions per second over the
  level's measured window [first send + unloaded latency, last send], the part of the level
  where a server that keeps up completes requests as fast as they arrive (the ramp-up before
  it and the drain after it are left out). It is compared with the completions due in that
  window (`offered_window_rps`: the requests whose send + unloaded latency falls in it, that
  latency being the TTFT of the first quarter of the requests, sent before a backlog could
  build, then their TPOT per output token), so the draw of a Poisson level and the lengths
  of the requests cancel; a server that falls behind completes fewer. A burst
  that a batcher takes in at once and then works off at its own pace is served at that pace,
  whatever the send rate was;
- sustained: served >= SUSTAINED x offered in the window (and the level was not stopped
  early);
- too short to judge: fewer than MIN_LEVEL_REQUESTS completed, or a planned arrival span
  ((n - 1) / r, so that the advice holds whatever the draw) shorter than SPAN_LATENCIES
  unloaded latencies (the drain then dominates the window, and one long
  request moves the verdict), or a level that looks sustained but whose span is shorter than
  STEADY_LATENCIES of its own (loaded) latencies (one to fill up, one at a steady state): by
  Little's law it holds rate x latency requests in flight there, and it ended before (a
  continuous batcher takes 40 requests at 17/s into one batch and keeps its TTFT low, then
  misses at 400), or (the capacity search, `queue_bound_s`: the SLO's TTFT or E2E) an arrival
  span shorter than QUEUE_SPAN x that bound: a server serving just under SUSTAINED of the
  offered rate builds a queue at (1 - SUSTAINED) of it, whose wait passes the SLO only after
  that long, so a shorter level cannot see it. The verdict says how many requests it needed.
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
QUEUE_SPAN = 1.0 / (1.0 - SUSTAINED)  # arrival span / SLO bound: a 10 % backlog shows


@dataclass
class LevelVerdict:
    completed: int
    sent_rps: float | None  # what the client offered (actual sends)
    achieved_rps: float | None  # served: completions/s over the measured window
    unloaded_e2e_s: float | None  # median E2E of the first quarter of the requests
    needed_requests: int | None  # requests a level at this rate needs to be judged
    sustained: bool | None  # None: too short to judge
    too_short: str | None  # why it could not be judged
    offered_window_rps: float | None = None  # sends/s a latency before that window
    reason: str = ""  # one line: the verdict as the sweep table shows it (label())

    def to_dict(self) -> dict:
        return asdict(self)


def _median(values) -> float | None:
    v = [x for x in values if x is not None]
    return statistics.median(v) if v else None


def needed_requests(rate: float, unloaded_e2e_s: float) -> int:
    """Requests whose arrival span at `rate` covers SPAN_LATENCIES unloaded latencies."""
    return max(MIN_LEVEL_REQUESTS, math.ceil(SPAN_LATENCIES * rate * unloaded_e2e_s) + 1)


def judge_level(
    records: Sequence[RequestRecord], rate: float, queue_bound_s: float | None = None
) -> LevelVerdict:
    """The verdict of one open-loop level at `rate` requests/s (module docstring)."""
    ok = sorted(
        (r for r in records if r.ok and not r.warmup and r.sent_s is not None and r.end_s),
        key=lambda r: r.sent_s,
    )
    n = len(ok)
    if n < 2:
        why = f"{n} completed request{'s' if n != 1 else ''}; needs at least {MIN_LEVEL_REQUESTS}"
        v = LevelVerdict(n, None, None, None, MIN_LEVEL_REQUESTS, None, why)
        v.reason = label(v)
        return v
    first_sent, last_sent = ok[0].sent_s, ok[-1].sent_s
    span = last_sent - first_sent
    early = ok[: max(1, n // 4)]
    unloaded = _median([r.e2e_s for r in early]) or 0.0
    sent = (n - 1) / span if span > 0 else None
    achieved = offered = None
    ttft_ref = _median([r.ttft_s for r in early])
    tpot_ref = _median([r.tpot_s for r in early])  # unloaded: a batch's stretch is the server's

    def expected_end(r: RequestRecord) -> float:
        """When the request would have ended with no backlog: its send, the early TTFT, then
        the early TPOT per output token (a long request finishing late is not a backlog)."""
        if ttft_ref is None or tpot_ref is None:
            return r.sent_s + unloaded
        tokens = r.output_tokens_server or r.output_tokens_client or 1
        return r.sent_s + ttft_ref + (tokens - 1) * tpot_ref

    ws, we = first_sent + unloaded, last_sent  # the measured window (module docstring)
    if we > ws:
        done = sum(ws <= r.end_s <= we for r in ok)
        due = sum(ws <= expected_end(r) <= we for r in ok)
        achieved, offered = done / (we - ws), due / (we - ws)
    need = needed_requests(rate, unloaded)
    if queue_bound_s:  # the span a queue needs to show (module docstring)
        need = max(need, math.ceil(QUEUE_SPAN * queue_bound_s * rate - 1e-9) + 1)
    too_short = None
    planned_span = (n - 1) / rate  # not the drawn span: the advice must hold for any draw
    if n < MIN_LEVEL_REQUESTS or planned_span < SPAN_LATENCIES * unloaded:
        too_short = (
            f"too short to judge: {n} requests at {rate:g}/s arrive over {planned_span:.2f} s, "
            f"less than {SPAN_LATENCIES:g}x the unloaded latency {unloaded:.2f} s"
            if n >= MIN_LEVEL_REQUESTS
            else f"too short to judge: {n} completed requests"
        ) + f"; needs --num-requests {need} or more"
    if too_short is None and queue_bound_s and planned_span < QUEUE_SPAN * queue_bound_s - 1e-9:
        too_short = (
            f"too short to judge: {n} requests at {rate:g}/s arrive over {planned_span:.2f} s; "
            f"a backlog growing at {1 - SUSTAINED:.0%} of the rate passes the SLO's "
            f"{queue_bound_s * 1e3:.0f} ms only after {QUEUE_SPAN * queue_bound_s:.2f} s; "
            f"needs --num-requests {need} or more"
        )
    sustained = None
    if too_short is None:
        sustained = achieved is not None and offered is not None and (
            achieved >= SUSTAINED * offered
        )
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
    v = LevelVerdict(n, sent, achieved, unloaded, need, sustained, too_short, offered)
    v.reason = label(v)
    return v


def label(v: LevelVerdict, stopped: str | None = None, interrupted: bool = False) -> str:
    """The verdict in one line, the sweep table's cell and sweep.json's `reason`: one source
    for both. A level the user interrupted, or a watch stopped, says so, never "too short"."""
    if interrupted:
        return f"interrupted after {v.completed} completed requests: not judged"
    if stopped:
        return f"stopped early: {stopped}"
    if v.too_short:
        return "too short to judge" + (
            f" (needs {v.needed_requests} requests)" if v.needed_requests else ""
        )
    if v.sustained is None:
        return ""
    if v.achieved_rps is None or v.offered_window_rps is None:
        return "sustained" if v.sustained else "not sustained"
    served = f"served {v.achieved_rps:.3g} of {v.offered_window_rps:.3g} req/s offered"
    return f"sustained ({served})" if v.sustained else f"not sustained ({served})"


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
    v = LevelVerdict(n, None, None, None, need, None, too_short)
    v.reason = label(v)
    return v
