"""When each request of an imported run was sent, where the tool's file does not say.

The `--from-run` fit replays every request's send, so a run without send times cannot be
fitted on invented ones. Some loads determine them from the run's own times:

- all at once (vLLM bench's default `--request-rate inf`, no `--max-concurrency`): every
  request sent at the start;
- a closed loop of C slots (`--request-rate inf --max-concurrency C`): the first C at the
  start, then each in the file's order when the earliest request in flight finished (its
  send + E2E; the client's own time between the two is not in the file).

A finite rate (Poisson or gamma arrivals from a seed) does not: its draws depend on the tool's
RNG state, so the fit refuses the run in one line (`missing_sends`).

Layer: planning. Imports: results.
"""

from __future__ import annotations

import heapq

from cbbench.harness.results.records import RequestRecord


def reconstruct(records: list[RequestRecord], load: dict) -> tuple[list[float] | None, str]:
    """(each record's send time in seconds from the start, or None where the load does not
    determine them; how they were found, or why not). Records in the file's order."""
    rate, slots = load.get("rate"), load.get("concurrency")
    if rate not in (None, "inf", float("inf")):
        return None, f"the run's arrivals were drawn at {rate} req/s (not recoverable)"
    if load.get("mode") not in (None, "closed"):
        return None, f"its load was {load.get('mode')!r} with no rate recorded"
    if not slots:
        return [0.0] * len(records), "all sent at the start (request rate inf, no concurrency cap)"
    if any(r.e2e_s is None for r in records):
        return None, f"a closed loop of {slots} needs every request's E2E, and some have none"
    free = [0.0] * int(slots)  # when each slot frees: a min-heap
    sends = []
    for r in records:
        t = heapq.heappop(free)
        sends.append(t)
        heapq.heappush(free, t + float(r.e2e_s or 0.0))
    return sends, (f"reconstructed from the closed loop of {slots} (request rate inf): each "
                   "request sent when the earliest one in flight finished, in the file's order")  # fmt: skip
