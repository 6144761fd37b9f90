"""Agent steps missing the prefix cache: every step after the first resends the whole history
(system prompt, tools, earlier calls and results), so nearly all of its prompt could be a cache
hit; a hit rate far below that share means prefix caching is off, the history's KV was evicted
during the tool's wait, or the steps of one session land on different replicas.

Fires on agent runs (records marked `agent_step`) when the later steps' hit rate is under
half their history share. Silent when the server reports no cached-token counts."""

from __future__ import annotations

import numpy as np
from cbbench.harness.diagnose.base import Finding, Rule, RunView, pct
from cbbench.harness.diagnose.fixes import fixes_for

MIN_STEPS = 5
MIN_HISTORY_SHARE = 0.5
MAX_HIT_FRACTION = 0.5  # fires below this fraction of the history share


def _hit(recs) -> float:
    prompt = sum(r.prompt_tokens_server for r in recs)
    return sum(r.extra["num_cached_tokens"] for r in recs) / prompt if prompt else 0.0


def check(v: RunView) -> Finding | None:
    steps = [
        r
        for r in v.ok
        if "agent_step" in r.extra
        and (r.turn or 1) > 1
        and isinstance(r.extra.get("num_cached_tokens"), (int, float))
        and r.prompt_tokens_server
    ]
    if len(steps) < MIN_STEPS:
        return None
    prompt = float(sum(r.prompt_tokens_server for r in steps))
    share = float(sum(min(r.history_len or 0, r.prompt_tokens_server) for r in steps)) / prompt
    hit = _hit(steps)
    if share < MIN_HISTORY_SHARE or hit >= MAX_HIT_FRACTION * share:
        return None
    evidence = [
        f"{len(steps)} agent steps after the first resent {pct(share)} of their prompt tokens "
        f"as history; the server served {pct(hit)} of their prompt tokens from its prefix cache"
    ]
    waits = [r for r in steps if isinstance(r.extra.get("tool_wait_s"), (int, float))]
    if len(waits) >= 2 * MIN_STEPS:
        median = float(np.median([r.extra["tool_wait_s"] for r in waits]))
        short = [r for r in waits if r.extra["tool_wait_s"] <= median]
        long = [r for r in waits if r.extra["tool_wait_s"] > median]
        if short and long:
            evidence.append(
                f"hit rate after tool waits <= {median:.2f} s: {pct(_hit(short))}, after longer "
                f"ones: {pct(_hit(long))} (lower after long waits: evicted while the tool ran)"
            )
    return Finding(
        rule=RULE.id,
        title="agent steps miss the prefix cache",
        cause="prefix caching is off, the history's KV blocks are evicted during tool waits, "
        "or a router sends a session's steps to different replicas",
        evidence=evidence,
        fixes=fixes_for("agent-cache"),
        values={"history_share": share, "step_hit_rate": hit, "steps": len(steps)},
    )


RULE = Rule("agent-cache", "agent steps get far fewer prefix-cache hits than they share", check)
