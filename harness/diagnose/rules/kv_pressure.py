"""KV pool full, requests preempted: the seed's "OOM after raising batch size" row."""

from __future__ import annotations

import numpy as np
from cbbench.harness.diagnose.base import Finding, Rule, RunView, fmt_ranges, ms, pct, true_ranges
from cbbench.harness.diagnose.fixes import fixes_for

KV_FULL = 0.9  # KV usage at or above this counts as full


def check(v: RunView) -> Finding | None:
    n, source = v.preemptions
    if not n:
        return None
    evidence = [f"{n} preemption{'s' if n != 1 else ''} during the run ({source})"]
    values: dict = {"preemptions": n}
    hit = [r for r in v.ok if (r.extra.get("num_preemptions") or 0) > 0]
    if hit:
        rest = [r for r in v.ok if not (r.extra.get("num_preemptions") or 0)]
        line = f"{len(hit)} of {len(v.ok)} requests were preempted at least once"
        if rest:
            e_hit = float(np.nanmedian(v.col("e2e_s", hit)))
            e_rest = float(np.nanmedian(v.col("e2e_s", rest)))
            line += f" (their E2E p50 {ms(e_hit)} vs {ms(e_rest)} for the others)"
            values.update(e2e_p50_preempted_s=e_hit, e2e_p50_other_s=e_rest)
        evidence.append(line)
        values["preempted_requests"] = len(hit)
    ranges: list[tuple[float, float]] = []
    t, kv = v.busy_series("kv_usage")
    if kv.size:
        full = kv >= KV_FULL
        ranges = true_ranges(t, full)
        values.update(kv_usage_max=float(kv.max()), kv_full_fraction=float(full.mean()))
        line = f"KV cache usage max {pct(kv.max())}, at or above {pct(KV_FULL)} in {pct(full.mean())} of samples"
        evidence.append(line + (f": {fmt_ranges(ranges)}" if ranges else ""))
    tw, waiting = v.busy_series("waiting")
    if waiting.size and waiting.max() > 0:
        evidence.append(
            f"waiting queue up to {waiting.max():.0f} requests (mean {waiting.mean():.1f})"
        )
    blocks = v.engine_info.get("num_kv_blocks")
    if blocks:
        bs = v.engine_info.get("block_size") or 0
        evidence.append(f"KV pool: {blocks} blocks x {bs} tokens = {blocks * bs} tokens")
    return Finding(
        rule=RULE.id,
        title="KV cache full: requests were preempted",
        cause="the running sequences need more KV blocks than the pool holds, so the scheduler "
        "evicts (and later recomputes) some; each preemption wastes the work done so far",
        evidence=evidence,
        fixes=fixes_for("kv-pressure"),
        time_ranges=ranges,
        values=values,
    )


RULE = Rule("kv-pressure", "preemptions while the KV pool is full", check)
