"""Head-of-line blocking under request-level batching, seen two ways:

- held slots: a run-to-completion batch (static, dynamic) admits nobody until its longest
  member ends, so while requests wait the slots of members that finished early stay held —
  `running` falls inside the batch, nobody is admitted, and the wait is the batch's longest
  request (the server's running/waiting gauges; silent for iteration-level servers);
- arrivals: a short request that arrives while a long one runs gets its first token only once
  the long one has ended, so its E2E tracks the longest request it overlapped, not its own
  length (request times only).
"""

from __future__ import annotations

import heapq

import numpy as np
from cbbench.harness.diagnose.base import Finding, Rule, RunView, ms, pct
from cbbench.harness.diagnose.fixes import fixes_for
from cbbench.harness.diagnose.slots import (
    RUN_TO_COMPLETION,
    admitted_s,
    held_slots,
    iteration_level,
)

SHORT = 0.5  # a request is short next to one with at least 1/SHORT times its output tokens
MIN_CANDIDATES = 4
BLOCKED_SHARE = 0.5
MIN_WAITING_SAMPLES = 4
BATCH_SHARE = 0.5  # requests waited while a batch ran in at least this share of samples ...
IDLE_SHARE = 0.3  # ... and at least this share of its slots ran no request
KV_FULL = 0.9  # a KV pool this full without reservations: memory, not slots, kept them out
RESERVED = 0.5  # reserved-but-unfilled KV at least this share of the pool: held memory
QUEUE_SHARE = 0.5  # queue p50 / TTFT p50 at or above this: the wait is worth a line
RESERVES = {
    "static": " (static reserves --max-model-len for every slot)",
    "dynamic": " (dynamic reserves prompt + max_tokens per request)",
}


def _held(v: RunView) -> tuple[list[str], dict] | None:
    if iteration_level(v):
        return None  # a finished slot is refilled at the next step there
    h = held_slots(v)
    if h is None or h.waiting_samples < MIN_WAITING_SAMPLES:
        return None
    if h.batch_share < BATCH_SHARE or h.idle_share < IDLE_SHARE:
        return None
    if h.kv_mean is not None and h.kv_mean >= KV_FULL and (h.reserved_share or 0.0) < RESERVED:
        return None  # the pool is full of tokens: memory, not the batch, keeps requests out
    evidence = [
        f"with requests waiting (mean {h.waiting_mean:.1f}) while a batch ran "
        f"({pct(h.batch_share)} of the samples with requests waiting), the server ran "
        f"{h.running_mean:.1f} of its {h.slots:.0f} batch slots on average: {pct(h.idle_share)} "
        "of the slots held by requests that had already finished (run to completion)",
    ]
    if h.drops:
        evidence.append(
            f"running fell in {h.drops} of {h.intervals} sample intervals with requests waiting, "
            "and waiting did not fall in those: slots freed, nobody admitted until the batch ended"
        )
    values: dict = {
        "slots": h.slots,
        "batch_share": h.batch_share,
        "running_mean": h.running_mean,
        "waiting_mean": h.waiting_mean,
        "idle_share": h.idle_share,
        "running_drops": h.drops,
        "kv_usage_mean": h.kv_mean,  # while requests waited
        "kv_usage_run_mean": v.kv_usage_mean,  # every sample: the report table's figure
        "kv_reserved_share": h.reserved_share,
    }
    if h.refill_s.size:
        r50, r90 = (float(np.percentile(h.refill_s, q)) for q in (50, 90))
        evidence.append(
            f"{h.refill_s.size} requests ended while others waited; the next admission came "
            f"p50 {ms(r50)} (p90 {ms(r90)}) after such an end, when the batch's longest member "
            "ended (iteration-level batching refills a freed slot at the next step)"
        )
        values["refill_p50_s"] = r50
    run_mean = v.kv_usage_mean
    kv = f"KV usage {pct(h.kv_mean)} on average while requests waited" + (
        f" (the run's mean, as the report's table: {pct(run_mean)})"
        if run_mean is not None and pct(run_mean) != pct(h.kv_mean)
        else ""
    )
    if h.reserved_share is not None and h.reserved_share >= RESERVED:
        evidence.append(
            f"{kv}, of which {pct(h.reserved_share)} of the pool "
            f"reserved up front and never filled{RESERVES.get(v.scheduler or '', '')}: memory "
            "held, not used"
        )
    elif h.kv_mean is not None:
        evidence.append(
            f"{kv}: memory was free; the batching policy, not the "
            "KV pool, kept the waiting requests out"
        )
    pairs = [(r.server_queue_s, r.ttft_s) for r in v.ok if admitted_s(r) is not None and r.ttft_s]
    q50, t50 = (
        (float(np.median([p[0] for p in pairs])), float(np.median([p[1] for p in pairs])))
        if len(pairs) >= MIN_CANDIDATES
        else (0.0, 0.0)
    )
    if t50 > 0 and q50 >= QUEUE_SHARE * t50:
        evidence.append(
            f"server queue time p50 {ms(q50)} ({pct(q50 / t50)} of TTFT p50 {ms(t50)}): spent "
            "behind running batches, not waiting for one to fill"
        )
        values["queue_p50_s"] = q50
    return evidence, values


def _arrivals(v: RunView) -> tuple[list[str], dict] | None:
    if iteration_level(v):
        # an iteration-level server (its scheduler or engine says so) refills a slot at the
        # next step: a short request behind a long one there waited for a full batch (the
        # batch-cap and kv-pressure rules' finding), not for request-level batching
        return None
    recs = [
        r
        for r in v.ok
        if r.sent_s is not None and r.first_token_s is not None and r.end_s is not None
    ]
    if len(recs) < MIN_CANDIDATES + 1:
        return None
    tol = max(2 * (v.itl_p50 or 0.0), 0.02)
    cands: list[tuple[float, float, float, float]] = []  # (wait, remaining, e2e, own decode)
    blocked = 0
    # sweep in send order; a max-heap on end time holds every request that had its first
    # token by then: its top, if not yet ended, is the longest request running at r's send
    by_first = sorted(recs, key=lambda x: x.first_token_s)  # type: ignore[arg-type, return-value]
    heap: list[tuple[float, int]] = []
    k = 0
    for r in sorted(recs, key=lambda x: x.sent_s):  # type: ignore[arg-type, return-value]
        while k < len(by_first) and by_first[k].first_token_s <= r.sent_s:  # type: ignore[operator]
            heapq.heappush(heap, (-by_first[k].end_s, k))  # type: ignore[operator]
            k += 1
        if not heap or -heap[0][0] <= r.sent_s:  # type: ignore[operator]
            heap.clear()  # everything that started has ended
            continue
        j = by_first[heap[0][1]]
        remaining = j.end_s - r.sent_s  # type: ignore[operator]
        if v.out_tokens(r) > SHORT * v.out_tokens(j) or remaining < 5 * tol:
            continue  # not short next to it, or it was about to end anyway: no test
        wait = r.first_token_s - r.sent_s  # type: ignore[operator]
        cands.append((wait, remaining, r.e2e_s or np.nan, r.end_s - r.first_token_s))  # type: ignore[operator]
        blocked += r.first_token_s >= j.end_s - tol  # type: ignore[operator]
    if len(cands) < MIN_CANDIDATES or blocked / len(cands) < BLOCKED_SHARE:
        return None
    a = np.asarray(cands, dtype=np.float64)
    wait, remaining, e2e, own = a[:, 0], a[:, 1], a[:, 2], a[:, 3]
    corr = float(np.corrcoef(e2e, remaining)[0, 1]) if len(a) >= 3 and e2e.std() > 0 else None
    evidence = [
        f"{blocked} of {len(cands)} short requests sent while a longer one ran got their first "
        f"token only after that one ended (request-level batching)",
        f"their wait for the first token: p50 {ms(float(np.median(wait)))}, while the long "
        f"request had p50 {ms(float(np.median(remaining)))} left to run",
        f"short requests' E2E p50 {ms(float(np.nanmedian(e2e)))} vs their own decode time p50 "
        f"{ms(float(np.median(own)))}",
    ]
    if corr is not None:
        evidence.append(
            f"correlation of their E2E with the longest overlapped request's remaining time: {corr:.2f}"
        )
    values = {
        "candidates": len(cands),
        "blocked": blocked,
        "blocked_fraction": blocked / len(cands),
        "wait_p50_s": float(np.median(wait)),
        "e2e_remaining_corr": corr,
        "blocked_share_seen": pct(blocked / len(cands)),
    }
    return evidence, values


def check(v: RunView) -> Finding | None:
    held, arrivals = _held(v), _arrivals(v)
    if held is None and arrivals is None:
        return None
    evidence: list[str] = []
    values: dict = {}
    for part in (held, arrivals):
        if part is not None:
            evidence += part[0]
            values.update(part[1])
    values["mode"] = "run-to-completion" if held is not None else "arrivals"
    if v.scheduler:
        evidence.append(f"server scheduler: {v.scheduler}")
    if held is not None:
        title = (
            "requests wait behind a run-to-completion batch: finished requests' slots stay "
            "held (head-of-line blocking)"
        )
        cause = (
            "run-to-completion batching: a batch admits nobody until its longest member ends, "
            "so the slots of members that finished early are held, not free, and waiting "
            "requests queue behind the batch's longest request"
        )
    else:
        title = "short requests wait behind long ones (head-of-line blocking)"
        cause = (
            "request-level batching: a batch runs until its longest member ends and new "
            "requests join only between batches"
        )
    return Finding(
        rule=RULE.id,
        title=title,
        cause=cause,
        evidence=evidence,
        fixes=_fixes(v, values),
        values=values,
    )


def _fixes(v: RunView, values: dict) -> dict[str, str]:
    """The reference engine's fix from this run's own evidence: --scheduler continuous only
    where the server is not already continuous, a smaller --max-model-len only where static's
    reservations held the memory (not at a KV pool mostly free)."""
    fixes = fixes_for("hol-blocking")
    if v.scheduler not in RUN_TO_COMPLETION:
        return fixes  # unknown: the general advice, which names both
    parts = [
        "cbbench serve --scheduler continuous (continuous batching: a finished request's slot "
        "is refilled at the next step)"
    ]
    reserved = values.get("kv_reserved_share")
    if v.scheduler == "static" and reserved is not None and reserved >= RESERVED:
        parts.append("a smaller --max-model-len (static reserves it for every slot)")
    parts.append("cap long requests' max_tokens")
    fixes["cbbench"] = "; or ".join(parts)
    return fixes


RULE = Rule(
    "hol-blocking",
    "a run-to-completion batch holds finished slots while requests wait, or short requests' "
    "first token comes only after a long one ends",
    check,
)
