"""When each request of an imported run was sent, where the tool's file does not say.

The `--from-run` fit replays every request's send, so a run without send times cannot be
fitted on invented ones. Some loads determine them from the run's own times:

- all at once (vLLM bench's default `--request-rate inf`, no `--max-concurrency`): every
  request sent at the start;
- a closed loop of C slots (`--request-rate inf --max-concurrency C`): the first C at the
  start, then each in the file's order when the earliest request in flight finished (its
  send + E2E), plus the client's own time between the two: not in the file, but one
  constant gap is fixed by the run's duration (the replay ends when the run did).

A finite rate (Poisson or gamma arrivals from a seed) does not: its draws depend on the tool's
RNG state, so the fit refuses the run in one line (`missing_sends`).

Layer: planning. Imports: results.
"""

from __future__ import annotations

import heapq

from cbbench.harness.results.records import RequestRecord


def reconstruct(records: list[RequestRecord], load: dict,
                duration: float | None = None) -> tuple[list[float] | None, str]:  # fmt: skip
    """(each record's send time in seconds from the start, or None where the load does not
    determine them; how they were found, or why not). Records in the file's order;
    `duration`: the run's, where the file gives it (it fixes the client's gap in a loop)."""
    rate, slots = load.get("rate"), load.get("concurrency")
    if rate not in (None, "inf", float("inf")):
        return None, f"the run's arrivals were drawn at {rate} req/s (not recoverable)"
    if load.get("mode") not in (None, "closed"):
        return None, f"its load was {load.get('mode')!r} with no rate recorded"
    if not slots:
        return [0.0] * len(records), "all sent at the start (request rate inf, no concurrency cap)"
    if any(r.e2e_s is None for r in records):
        return None, f"a closed loop of {slots} needs every request's E2E, and some have none"
    e2e = [float(r.e2e_s or 0.0) for r in records]
    sends = _closed_loop(e2e, int(slots), 0.0)
    how = (f"reconstructed from the closed loop of {slots} (request rate inf): each request "
           "sent when the earliest one in flight finished, in the file's order")  # fmt: skip
    if duration and _end(e2e, sends) < duration:
        # the client's time between a finish and the next send is not in the file, but the
        # run's duration fixes its mean: the gap whose replay ends when the run did
        lo, hi = 0.0, (duration - _end(e2e, sends)) * int(slots) / max(len(e2e) - int(slots), 1)
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _end(e2e, _closed_loop(e2e, int(slots), mid)) < duration else (lo, mid)
        sends = _closed_loop(e2e, int(slots), lo)
        how += f", {lo * 1e3:.2f} ms after it (the client's gap that ends the replay at the run's {duration:.2f} s)"
    return sends, how


def _closed_loop(e2e: list[float], slots: int, gap: float) -> list[float]:
    free = [-gap] * slots  # when each slot frees (a min-heap); the first sends at 0
    sends = []
    for d in e2e:
        t = heapq.heappop(free) + gap
        sends.append(t)
        heapq.heappush(free, t + d)
    return sends


def _end(e2e: list[float], sends: list[float]) -> float:
    return max((s + d for s, d in zip(sends, e2e, strict=True)), default=0.0)
