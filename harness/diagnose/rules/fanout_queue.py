"""Fan-out bursts queueing behind each other: an agent graph's sibling calls (those waiting on
the same predecessors) become ready at one moment and are sent together; a server that
prefills them one after another (a small per-step token budget, few sequences a step) gives
the k-th sibling a TTFT of about k prefills, and the session's makespan waits for the last.

Fires on agent-graph runs (records with `extra.graph`) with >= MIN_BURSTS bursts of >= 2
siblings, when the last sibling's TTFT is, at the median burst, >= RATIO x the first's and
>= MIN_GAP_S later. The evidence says whether the client's cap (`client_queue_s`) or the
server held them."""

from __future__ import annotations

import numpy as np
from cbbench.harness.diagnose.base import Finding, Rule, RunView, ms
from cbbench.harness.diagnose.fixes import fixes_for

MIN_BURSTS = 3
RATIO = 2.0
MIN_GAP_S = 0.05


def check(v: RunView) -> Finding | None:
    groups: dict[tuple, list] = {}
    for r in v.measured:
        g = r.extra.get("graph")
        if isinstance(g, dict) and g.get("after"):
            groups.setdefault((r.session_id, tuple(g["after"])), []).append(r)
    bursts = []
    for recs in groups.values():
        ok = [r for r in recs if r.ok and r.ttft_s is not None and r.sent_s is not None]
        if len(recs) >= 2 and len(ok) == len(recs):
            bursts.append(sorted(r.ttft_s for r in ok))
    if len(bursts) < MIN_BURSTS:
        return None
    first = float(np.median([b[0] for b in bursts]))
    last = float(np.median([b[-1] for b in bursts]))
    if last < RATIO * first or last - first < MIN_GAP_S:
        return None
    width = float(np.median([len(b) for b in bursts]))
    held = [r.client_queue_s or 0.0 for recs in groups.values() if len(recs) >= 2 for r in recs]
    client = float(np.median(held)) if held else 0.0
    evidence = [
        f"{len(bursts)} fan-out bursts (median {width:g} calls each, ready together): the fastest "
        f"sibling's TTFT p50 {ms(first)}, the slowest's {ms(last)} ({last / first:.1f}x)",
        f"siblings' client queue (--concurrency slots) p50 {ms(client)}"
        + (": the client's cap holds them back" if client > 0.5 * (last - first) else
           ": the server queued them"),
    ]  # fmt: skip
    return Finding(
        rule=RULE.id,
        title="fan-out bursts queue behind each other",
        cause="the server prefills a burst's sibling calls one after another (token budget per "
        "step, sequences per step) or the client's concurrency cap holds them; the session "
        "waits for the last sibling",
        evidence=evidence,
        fixes=fixes_for("fanout-queue"),
        values={"bursts": len(bursts), "ttft_first_p50_s": first, "ttft_last_p50_s": last},
    )


RULE = Rule(
    "fanout-queue", "agent-graph sibling calls sent together get TTFTs growing with rank", check
)
