"""TTFO dominated by reasoning: the first token comes quickly, the first answer token late,
because the model thinks first. Nothing is wrong with the server: the lever is how much the
model reasons (reasoning effort, a thinking budget, `enable_thinking`)."""

from __future__ import annotations

import numpy as np
from cbbench.harness.diagnose.base import Finding, Rule, RunView, ms, pct
from cbbench.harness.diagnose.fixes import fixes_for

SHARE = 0.5  # reasoning time p50 / TTFO p50 at or above this: reasoning dominates the wait
MIN_REASONING_S = 0.05  # less than this is not a wait a user notices


def check(v: RunView) -> Finding | None:
    rows = [
        (r.ttft_s, r.ttfo_s, r.reasoning_s, r.reasoning_tokens)
        for r in v.ok
        if r.ttft_s is not None and r.ttfo_s is not None and r.reasoning_s is not None
        and r.reasoning_tokens
    ]  # fmt: skip
    if len(rows) < 5:
        return None
    ttft, ttfo, think, n = np.asarray(rows, dtype=np.float64).T
    t50, o50, r50 = float(np.median(ttft)), float(np.median(ttfo)), float(np.median(think))
    if r50 < MIN_REASONING_S or r50 < SHARE * o50:
        return None
    out = [
        r.output_tokens_server or r.output_tokens_client or 0 for r in v.ok if r.reasoning_tokens
    ]
    share = float(n.sum()) / sum(out) if sum(out) else None
    evidence = [
        f"TTFO p50 {ms(o50)} (first answer token) against TTFT p50 {ms(t50)} (first token)",
        f"reasoning p50 {ms(r50)}: {pct(r50 / o50)} of the wait for the answer",
        f"reasoning tokens p50 {np.median(n):.0f} per request"
        + ("" if share is None else f", {pct(share)} of all output tokens"),
        f"{len(rows)} of {len(v.ok)} successful requests reasoned before answering",
    ]
    return Finding(
        rule=RULE.id,
        title="TTFO dominated by reasoning: the answer waits for the model to think",
        cause="the model streams its reasoning first; TTFT is fine, the user-felt wait (TTFO) "
        "is the reasoning's length times the decode speed",
        evidence=evidence,
        fixes=fixes_for("reasoning-wait"),
        severity="info",
        values={
            "ttft_p50_s": t50,
            "ttfo_p50_s": o50,
            "reasoning_p50_s": r50,
            "reasoning_share_of_ttfo": r50 / o50,
            "reasoning_share_of_output": share,
        },
    )


RULE = Rule(
    "reasoning-wait",
    "TTFO far above TTFT because requests reason first (reasoning >= half the answer's wait)",
    check,
)
