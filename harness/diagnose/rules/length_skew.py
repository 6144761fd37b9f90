"""Extreme length distributions: a few very long requests hold KV memory and batch slots far
longer than the typical one."""

from __future__ import annotations

import numpy as np
from cbbench.harness.diagnose.base import Finding, Rule, RunView, ms, pct
from cbbench.harness.diagnose.fixes import fixes_for

MAX_OVER_P50 = 8.0  # the longest request at least this many times the median one
TOP_SHARE = 0.4  # ... and the longest 10% of requests hold at least this share of tokens
MIN_REQUESTS = 10


def check(v: RunView) -> Finding | None:
    recs = v.ok
    if len(recs) < MIN_REQUESTS:
        return None
    total = np.asarray([v.prompt_tokens(r) + v.out_tokens(r) for r in recs], dtype=np.float64)
    p50 = float(np.median(total))
    if p50 <= 0 or total.max() < MAX_OVER_P50 * p50:
        return None
    order = np.sort(total)[::-1]
    top_n = max(1, len(order) // 10)
    share = float(order[:top_n].sum() / order.sum())
    if share < TOP_SHARE:
        return None
    longest = recs[int(np.argmax(total))]
    e2e = v.col("e2e_s")
    evidence = [
        f"prompt + output tokens per request: p50 {p50:.0f}, p90 "
        f"{np.percentile(total, 90):.0f}, max {total.max():.0f} ({total.max() / p50:.0f}x the median)",
        f"the longest {top_n} of {len(recs)} requests carry {pct(share)} of all tokens",
    ]
    if longest.e2e_s is not None and np.isfinite(e2e).any():
        evidence.append(
            f"the longest request ran {ms(longest.e2e_s)} ({longest.e2e_s / np.nanmedian(e2e):.0f}x "
            f"the E2E p50 {ms(float(np.nanmedian(e2e)))}), holding its KV and batch slot throughout"
        )
    ranges = []
    if longest.sent_s is not None and longest.end_s is not None:
        ranges = [(longest.sent_s, longest.end_s)]
    return Finding(
        rule=RULE.id,
        title="extreme request lengths: a few requests dominate the tokens",
        cause="a heavy-tailed length distribution: the longest requests occupy KV memory and "
        "batch slots long after the typical request is done",
        evidence=evidence,
        fixes=fixes_for("length-skew"),
        severity="info",
        time_ranges=ranges,
        values={"tokens_p50": p50, "tokens_max": float(total.max()), "top10_share": share},
    )


RULE = Rule("length-skew", "a heavy tail of very long requests", check)
