"""Failed requests: the server shed load (429/503), rejected requests (400: too long for its
context), timed out, or dropped connections. Latency numbers then describe survivors only."""

from __future__ import annotations

from collections import Counter

from cbbench.harness.diagnose.base import Finding, Rule, RunView, pct
from cbbench.harness.diagnose.fixes import fixes_for
from cbbench.harness.results.outcome import failed_at, server_gone
from cbbench.harness.results.records import RequestRecord

MIN_SHARE = 0.01  # at least 1% of the measured requests (and at least one)

# what each kind of failure means, and the fixes table (harness/diagnose/fixes.py) it picks
CAUSES = {
    "connection": "the server stopped answering: connections were refused or cut mid-response, "
    "or it answered 503 'shutting down' (it crashed, was killed or stopped, or ran out of "
    "memory)",
    "shed": "the server shed load (HTTP 429/503: its queue was full)",
    "context": "the server rejected requests too long for its context (HTTP 400/413/422)",
    "timeout": "requests ran past the client's timeout",
}


def cause_of(r: RequestRecord) -> str | None:
    """Which kind of failure a failed request is (None: another kind)."""
    if server_gone(r):
        return "connection"
    if r.error_kind == "timeout":
        return "timeout"
    err = r.error or ""
    if err.startswith(("HTTP 429", "HTTP 503")):
        return "shed"
    if err.startswith(("HTTP 400", "HTTP 413", "HTTP 422")):
        return "context"
    return None


def _fixes(causes: Counter) -> dict[str, str]:
    """Each engine's fixes for the kinds of failure seen, the most frequent first."""
    known = [c for c, _ in causes.most_common() if c is not None]
    if not known:
        return fixes_for("errors")
    tables = [fixes_for(f"errors-{c}") for c in known]
    return {eng: "; ".join(t[eng] for t in tables) for eng in tables[0]}


def check(v: RunView) -> Finding | None:
    failed = [r for r in v.measured if not r.ok]
    if not failed or len(failed) < MIN_SHARE * len(v.measured):
        return None
    kinds = Counter(r.error_kind or "unknown" for r in failed)
    causes = Counter(map(cause_of, failed))
    reasons = Counter((r.error or "unknown")[:100] for r in failed)
    evidence = [
        f"{len(failed)} of {len(v.measured)} requests failed ({pct(len(failed) / len(v.measured))}): "
        + ", ".join(f"{k} ×{n}" for k, n in kinds.most_common()),
        "most common: " + "; ".join(f"{msg!r} ×{n}" for msg, n in reasons.most_common(2)),
    ]
    ends = [t for t in map(failed_at, failed) if t is not None]
    ranges = [(min(ends), max(ends))] if ends else []
    if ranges:
        evidence.append(f"failures between {ranges[0][0]:.1f} and {ranges[0][1]:.1f} s")
    evidence.append("latency percentiles cover the successful requests only")
    return Finding(
        rule=RULE.id,
        title="requests failed",
        cause="; ".join(CAUSES[c] for c, _ in causes.most_common() if c is not None)
        or "the server rejected or shed requests, or they timed out or lost their connection",
        evidence=evidence,
        fixes=_fixes(causes),
        time_ranges=ranges,
        values={"failed": len(failed), "by_kind": dict(kinds)},
    )


RULE = Rule("errors", "failed requests (shed load, too long, timeouts, dropped connections)", check)
