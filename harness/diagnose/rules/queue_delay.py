"""Queue time dominating TTFT under a dynamic batcher: requests sit in the queue waiting for a
batch to fill (max_queue_delay too long) while the server has free slots."""

from __future__ import annotations

import numpy as np
from cbbench.harness.diagnose.base import Finding, Rule, RunView, ms, pct
from cbbench.harness.diagnose.fixes import fixes_for

SHARE = 0.5  # queue p50 / TTFT p50 at or above this: queue time dominates
MIN_QUEUE_S = 0.02
NOT_FULL = 0.9  # mean batch occupancy under this: batches left the queue part-full
REQUEST_LEVEL = ("dynamic", "static")  # the reference engine's batchers that wait to fill
ITERATION_LEVEL = ("continuous",)
ITERATION_LEVEL_ENGINES = ("vllm", "sglang", "tgi")
BOUNDED = 2.0  # queue max <= BOUNDED x queue p50: a fixed delay, not a growing queue


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
    if v.scheduler in ITERATION_LEVEL or v.engine in ITERATION_LEVEL_ENGINES:
        return None  # no batching delay there: a long queue means a full server
    if not (v.scheduler in REQUEST_LEVEL or v.engine == "triton" or bounded):
        return None
    evidence = [
        f"server queue time p50 {ms(q50)} is {pct(q50 / t50)} of TTFT p50 {ms(t50)}",
        f"queue time p90 {ms(float(np.percentile(q, 90)))}, max {ms(float(q.max()))}"
        + (" — bounded like a fixed batching delay, not a growing backlog" if bounded else ""),
    ]
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
        },
    )


RULE = Rule("queue-delay", "server queue time dominates TTFT with free batch slots", check)
