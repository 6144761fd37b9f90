"""Failed requests: the server shed load (429/503), rejected requests (400: too long for its
context), timed out, or dropped connections. Latency numbers then describe survivors only."""

from __future__ import annotations

from collections import Counter

from cbbench.harness.diagnose.base import Finding, Rule, RunView, pct
from cbbench.harness.diagnose.fixes import fixes_for

MIN_SHARE = 0.01  # at least 1% of the measured requests (and at least one)


def check(v: RunView) -> Finding | None:
    failed = [r for r in v.measured if not r.ok]
    if not failed or len(failed) < MIN_SHARE * len(v.measured):
        return None
    kinds = Counter(r.error_kind or "unknown" for r in failed)
    reasons = Counter((r.error or "unknown")[:100] for r in failed)
    evidence = [
        f"{len(failed)} of {len(v.measured)} requests failed ({pct(len(failed) / len(v.measured))}): "
        + ", ".join(f"{k} ×{n}" for k, n in kinds.most_common()),
        "most common: " + "; ".join(f"{msg!r} ×{n}" for msg, n in reasons.most_common(2)),
    ]
    ends = [r.end_s for r in failed if r.end_s is not None]
    ranges = [(min(ends), max(ends))] if ends else []
    if ranges:
        evidence.append(f"failures between {ranges[0][0]:.1f} and {ranges[0][1]:.1f} s")
    evidence.append("latency percentiles cover the successful requests only")
    return Finding(
        rule=RULE.id,
        title="requests failed",
        cause="the server rejected or shed requests (queue limit, context length), or they "
        "timed out or lost their connection",
        evidence=evidence,
        fixes=fixes_for("errors"),
        time_ranges=ranges,
        values={"failed": len(failed), "by_kind": dict(kinds)},
    )


RULE = Rule("errors", "failed requests (shed load, too long, timeouts, dropped connections)", check)
