"""The `sessions` part of a run summary: what multi-turn traffic did to latency and caching.

TTFT of first turns against later turns (a later turn resends the history: without a prefix
cache its prefill grows, with one most of it is a cache hit), per-turn rows, the history
length resent before each new message, and the prefix-cache hit rate: per turn from the
tokens the server says it served from cache (`cbbench.num_cached_tokens` of the reference
engine, `usage.prompt_tokens_details.cached_tokens` of vLLM), and over the run from the
server's own counters when a server sampler ran (added by the runner).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from cbbench.workloads.stats import describe, describe_array
from cbbench.harness.results.records import RequestRecord


def _cached(r: RequestRecord) -> int | None:
    v = r.extra.get("num_cached_tokens")
    return int(v) if isinstance(v, (int, float)) else None


def _hit_rate(recs: Sequence[RequestRecord]) -> float | None:
    """Cached prompt tokens / prompt tokens, over the records the server reported both for."""
    cached = prompt = 0
    for r in recs:
        c, p = _cached(r), r.prompt_tokens_server
        if c is not None and p:
            cached += c
            prompt += p
    return cached / prompt if prompt else None


def session_summary(records: Sequence[RequestRecord]) -> dict | None:
    """None when no record belongs to a session."""
    measured = [r for r in records if not r.warmup and r.session_id is not None]
    if not measured:
        return None
    ok = [r for r in measured if r.ok]
    first = [r for r in ok if (r.turn or 1) == 1]
    later = [r for r in ok if (r.turn or 1) > 1]
    by_turn: dict[str, dict] = {}
    for turn in sorted({r.turn or 1 for r in ok}):
        rows = [r for r in ok if (r.turn or 1) == turn]
        ttft = describe(r.ttft_s for r in rows)
        by_turn[str(turn)] = {
            "count": len(rows),
            "ttft_p50_s": ttft["p50"],
            "ttft_mean_s": ttft["mean"],
            "history_len_mean": describe(r.history_len for r in rows)["mean"],
            "prompt_tokens_mean": describe(r.prompt_tokens_server for r in rows)["mean"],
            "prefix_cache_hit_rate": _hit_rate(rows),
        }
    sessions = {r.session_id for r in measured}
    failed = {r.session_id for r in measured if not r.ok}
    history = np.asarray([r.history_len for r in ok if r.history_len is not None], np.float64)
    return {
        "sessions": len(sessions),
        "sessions_with_failure": len(failed),
        "turns_max": max((r.turn or 1 for r in measured), default=0),
        "ttft_turn1_s": describe(r.ttft_s for r in first),
        "ttft_later_turns_s": describe(r.ttft_s for r in later),
        "history_len": describe_array(history),
        "prefix_cache_hit_rate": _hit_rate(ok),
        "prefix_cache_hit_rate_turn1": _hit_rate(first),
        "prefix_cache_hit_rate_later_turns": _hit_rate(later),
        "history_gaps": sum(bool(r.extra.get("history_gap")) for r in measured),
        "by_turn": by_turn,
    }


def add_server_hit_rate(summary: dict) -> None:
    """A run with sessions and a server sampler: the prefix-cache hit rate from the server's
    own counters over the whole run (`sessions.prefix_cache_hit_rate_server`)."""
    if "sessions" not in summary or "telemetry" not in summary:
        return
    rates = [t.get("prefix_cache_hit_rate") for t in summary["telemetry"].values()]
    rates = [x for x in rates if isinstance(x, (int, float))]
    summary["sessions"]["prefix_cache_hit_rate_server"] = rates[0] if rates else None
