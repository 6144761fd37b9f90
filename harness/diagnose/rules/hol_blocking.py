"""Head-of-line blocking under request-level batching: a short request that arrives while a
long one runs gets its first token only once the long one has ended, so its E2E tracks the
longest request it overlapped, not its own length."""

from __future__ import annotations

import heapq

import numpy as np
from cbbench.harness.diagnose.base import Finding, Rule, RunView, ms, pct
from cbbench.harness.diagnose.fixes import fixes_for

SHORT = 0.5  # a request is short next to one with at least 1/SHORT times its output tokens
MIN_CANDIDATES = 4
BLOCKED_SHARE = 0.5


def check(v: RunView) -> Finding | None:
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
    if v.scheduler:
        evidence.append(f"server scheduler: {v.scheduler}")
    return Finding(
        rule=RULE.id,
        title="short requests wait behind long ones (head-of-line blocking)",
        cause="request-level batching: a batch runs until its longest member ends and new "
        "requests join only between batches",
        evidence=evidence,
        fixes=fixes_for("hol-blocking"),
        values={
            "candidates": len(cands),
            "blocked": blocked,
            "blocked_fraction": blocked / len(cands),
            "wait_p50_s": float(np.median(wait)),
            "e2e_remaining_corr": corr,
            "blocked_share_seen": pct(blocked / len(cands)),
        },
    )


RULE = Rule("hol-blocking", "short requests' first token waits for the longest running one", check)
