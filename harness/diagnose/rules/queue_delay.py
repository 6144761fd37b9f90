"""Queue time dominating TTFT under a dynamic batcher: requests sit in the queue waiting for a
batch to fill (max_queue_delay too long) while the server has free slots.

A slot held by a running run-to-completion batch is not a free slot: when the server was
running a batch for most of the time requests spent queued, they waited behind that batch
(`hol-blocking`, or a full server), not for one to fill, and this rule stays silent."""

from __future__ import annotations

import numpy as np
from cbbench.harness.diagnose.base import Finding, Rule, RunView, ms, pct
from cbbench.harness.diagnose.fixes import fixes_for
from cbbench.harness.diagnose.slots import (
    MIN_QUEUE_S,
    RUN_TO_COMPLETION,
    iteration_level,
    queue_busy_share,
)

SHARE = 0.5  # queue p50 / TTFT p50 at or above this: queue time dominates
NOT_FULL = 0.9  # mean batch occupancy under this: batches left the queue part-full
BOUNDED = 2.0  # queue max <= BOUNDED x queue p50: a fixed delay, not a growing queue
BUSY = 0.5  # another request ran for at least this share of the queued time: not a delay


def check(v: RunView) -> Finding | None:
    pairs = [
        (r.server_queue_s, r.ttft_s) for r in v.ok if r.server_queue_s is not None and r.ttft_s
    ]
    if len(pairs) < 5:
        return None
    q, ttft = np.asarray(pairs, dtype=np.float64).T
    q50, t50 = float(np.median(q)), float(np.median(ttft))
    if q50 < MIN_QUEUE_S or q50 < SHARE * t50:
        return None
    _, occ = v.busy_series("batch_occupancy")
    if occ.size and occ.mean() >= NOT_FULL:
        return None  # full batches: an overloaded server, not a batching delay
    bounded = float(q.max()) <= BOUNDED * q50
    if iteration_level(v):
        return None  # no batching delay there: a long queue means a full server
    if not (v.scheduler in RUN_TO_COMPLETION or v.engine == "triton" or bounded):
        return None
    busy = queue_busy_share(v)
    if busy is not None and busy[0] >= BUSY:
        return None  # they queued behind a running batch: its slots were held, not free
    evidence = [
        f"server queue time p50 {ms(q50)} is {pct(q50 / t50)} of TTFT p50 {ms(t50)}",
        f"queue time p90 {ms(float(np.percentile(q, 90)))}, max {ms(float(q.max()))}"
        + (" — bounded like a fixed batching delay, not a growing backlog" if bounded else ""),
    ]
    if busy is not None:
        evidence.append(
            f"the server ran no request for {pct(1 - busy[0])} of the time {busy[1]} requests "
            "spent queued: they waited for a batch to form, not behind a running one"
        )
    if occ.size:
        evidence.append(f"batch occupancy mean {pct(float(occ.mean()))}: batches left part-full")
    if v.scheduler:
        evidence.append(f"server scheduler: {v.scheduler}")
    return Finding(
        rule=RULE.id,
        title="queue time dominates TTFT: requests wait for a batch to fill",
        cause="a request-level (dynamic) batcher holds requests until a preferred batch size is "
        "reached or max_queue_delay expires; at this load the delay is what TTFT pays",
        evidence=evidence,
        fixes=fixes_for("queue-delay"),
        values={
            "queue_p50_s": q50,
            "ttft_p50_s": t50,
            "queue_share": q50 / t50,
            "queue_max_s": float(q.max()),
            "queue_busy_share": None if busy is None else busy[0],
        },
    )


RULE = Rule(
    "queue-delay",
    "server queue time dominates TTFT while the server has free slots and runs nothing",
    check,
)
