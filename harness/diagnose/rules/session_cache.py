"""Multi-turn traffic without prefix-cache hits: every turn re-prefills its whole history.

Fires on runs with sessions (records carrying `turn`) when the later turns' prompts are mostly
history, yet the server reports (almost) no cached prompt tokens for them. Silent when the
server reports no cached-token counts (a rule never guesses)."""

from __future__ import annotations

import numpy as np
from cbbench.harness.diagnose.base import Finding, Rule, RunView, ms, pct
from cbbench.harness.diagnose.fixes import fixes_for

MIN_LATER_TURNS = 5
MIN_HISTORY_SHARE = 0.5  # later turns' prompts are at least this much history
MAX_HIT_RATE = 0.1  # ... and at most this share of their prompt tokens came from the cache


def check(v: RunView) -> Finding | None:
    later = [  # agent steps: agent_cache.py judges them
        r
        for r in v.ok
        if r.session_id is not None and (r.turn or 1) > 1 and "agent_step" not in r.extra
    ]
    reported = [
        r
        for r in later
        if isinstance(r.extra.get("num_cached_tokens"), (int, float)) and r.prompt_tokens_server
    ]
    if len(reported) < MIN_LATER_TURNS:
        return None
    prompt = np.asarray([r.prompt_tokens_server for r in reported], dtype=np.float64)
    cached = np.asarray([r.extra["num_cached_tokens"] for r in reported], dtype=np.float64)
    history = np.asarray([r.history_len or 0 for r in reported], dtype=np.float64)
    share = float(history.sum() / prompt.sum())
    hit = float(cached.sum() / prompt.sum())
    if share < MIN_HISTORY_SHARE or hit > MAX_HIT_RATE:
        return None
    first = [r.ttft_s for r in v.ok if r.session_id is not None and (r.turn or 1) == 1]
    second = [r.ttft_s for r in later if r.ttft_s is not None]
    evidence = [
        f"{len(reported)} later turns resent {pct(share)} of their prompt tokens as history "
        f"(median {np.median(history):.0f} tokens), and the server served {pct(hit)} of them "
        "from its prefix cache",
    ]
    if first and second and all(x is not None for x in first):
        evidence.append(
            f"TTFT p50: first turns {ms(float(np.median(first)))}, later turns "
            f"{ms(float(np.median(second)))} (each re-prefills the whole conversation)"
        )
    return Finding(
        rule=RULE.id,
        title="multi-turn sessions miss the prefix cache",
        cause="prefix caching is off, or the history's KV blocks are evicted between turns "
        "(a think time longer than the cache keeps them, or too little KV memory)",
        evidence=evidence,
        fixes=fixes_for("session-cache"),
        values={"history_share": share, "later_turn_hit_rate": hit, "later_turns": len(reported)},
    )


RULE = Rule("session-cache", "multi-turn sessions re-prefill their history (no cache hits)", check)
