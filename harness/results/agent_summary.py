"""The `prefix_cache` and `agent` parts of a run summary.

`prefix_cache`: the achieved hit rate (cached prompt tokens / prompt tokens, from
`usage.prompt_tokens_details.cached_tokens` or the reference engine's own count) over the
measured requests the server reported it for, beside the workload's intended rate
(shared-prefix: primed or cold, by whether the run was primed).

`agent` (runs with agent sessions): per step TTFT against the context length, the hit rate per
step, the tool waits (shown apart: a request's latency never holds them) and each finished
session's makespan, task start (its first request ready) to final answer (last token).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cbbench.harness.results.graph_summary import graph_lines, graph_summary
from cbbench.harness.results.records import RequestRecord
from cbbench.workloads.stats import describe

CONTEXT_BINS = (  # context tokens: steps of 1.5x-2x
    0, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
    49152, 65536, 98304, 131072, 1 << 40,
)  # fmt: skip


def _hit_rate(recs: Sequence[RequestRecord]) -> tuple[float | None, int]:
    cached = prompt = n = 0
    for r in recs:
        c = r.extra.get("num_cached_tokens")
        if isinstance(c, (int, float)) and r.prompt_tokens_server:
            cached += int(c)
            prompt += r.prompt_tokens_server
            n += 1
    return (cached / prompt if prompt else None), n


def prefix_cache_summary(
    records: Sequence[RequestRecord], source: Mapping, primed: bool, flushed: bool = False
) -> dict:
    """`source`: the workload's source (`Workload.source`, run.json's `workload.source`)."""
    ok = [r for r in records if r.ok and not r.warmup]
    rate, n = _hit_rate(ok)
    intended = (source.get("shared_prefix") or {}).get("intended_hit_rate") or {}
    return {
        "hit_rate": rate,
        "requests_reported": n,
        "intended_hit_rate": intended.get("primed" if primed else "cold"),
        "primed": primed,
        "flushed": flushed,  # neither: the cache held whatever earlier traffic left
    }


def _context_rows(steps: Sequence[RequestRecord]) -> list[dict]:
    rows = []
    for lo, hi in zip(CONTEXT_BINS, CONTEXT_BINS[1:]):
        rs = [r for r in steps if r.prompt_tokens_server and lo <= r.prompt_tokens_server < hi]
        if not rs:
            continue
        ttft = describe(r.ttft_s for r in rs)
        rows.append(
            {
                "context_tokens": [lo, hi if hi < CONTEXT_BINS[-1] else None],
                "count": len(rs),
                "ttft_p50_s": ttft["p50"],
                "ttft_p90_s": ttft["p90"],
                "prefix_cache_hit_rate": _hit_rate(rs)[0],
            }
        )
    return rows


def session_makespans(records: Sequence[RequestRecord]) -> list[float]:
    """Each finished agent session's makespan: its first step ready (task start) -> its final
    answer's last byte. Sessions with a failed step, or cut by the run's end, have none."""
    by_session: dict[str, list[RequestRecord]] = {}
    for r in records:
        if not r.warmup and "agent_step" in r.extra:
            by_session.setdefault(r.session_id or r.id, []).append(r)
    out = []
    for recs in by_session.values():
        recs.sort(key=lambda r: r.turn or 0)
        first, last = recs[0], recs[-1]
        done = last.extra.get("agent_step") == "answer" and all(r.ok for r in recs)
        if done and first.ready_s is not None and last.end_s is not None:
            out.append(last.end_s - first.ready_s)
    return out


def agent_summary(records: Sequence[RequestRecord]) -> dict | None:
    """None when no record is an agent step."""
    steps = [r for r in records if not r.warmup and "agent_step" in r.extra]
    if not steps:
        return None
    ok = [r for r in steps if r.ok]
    by_session: dict[str, list[RequestRecord]] = {}
    for r in steps:
        by_session.setdefault(r.session_id or r.id, []).append(r)
    makespans = session_makespans(steps)
    incomplete = len(by_session) - len(makespans)
    by_step = {}
    for turn in sorted({r.turn or 1 for r in ok}):
        rs = [r for r in ok if (r.turn or 1) == turn]
        by_step[str(turn)] = {
            "count": len(rs),
            "ttft_p50_s": describe(r.ttft_s for r in rs)["p50"],
            "context_tokens_mean": describe(r.prompt_tokens_server for r in rs)["mean"],
            "prefix_cache_hit_rate": _hit_rate(rs)[0],
        }
    waits = [r.extra.get("tool_wait_s") for r in steps]
    return {
        "sessions": len(by_session),
        "sessions_finished": len(makespans),
        "sessions_unfinished": incomplete,  # a failed step, or the run ended first
        "steps": len(steps),
        "tool_calls": sum(r.extra.get("agent_step") == "call" for r in steps),
        "makespan_s": describe(makespans),
        "tool_wait_s": describe(w for w in waits if isinstance(w, (int, float))),
        "ttft_s": describe(r.ttft_s for r in ok),
        "prefix_cache_hit_rate": _hit_rate(ok)[0],
        "ttft_by_context": _context_rows(ok),
        "by_step": by_step,
    }


def add_cache_summaries(
    summary: dict,
    records: Sequence[RequestRecord],
    source: Mapping,
    primed: bool,
    flushed: bool = False,
) -> None:
    """What `bench` adds to its summary, and `merge` from the merged records of its shards."""
    summary["prefix_cache"] = prefix_cache_summary(records, source, primed, flushed)
    agents = agent_summary(records)
    if agents is not None:
        summary["agent"] = agents
    graphs = graph_summary(records)
    if graphs is not None:
        summary["graph"] = graphs


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f} s"


def cache_lines(summary: dict) -> list[str]:
    """What the run printed about the prefix cache and agent sessions (nothing if unknown)."""
    out = []
    pc = summary.get("prefix_cache") or {}
    if pc.get("intended_hit_rate") is not None or pc.get("primed") or (pc.get("hit_rate") or 0) > 0:
        line = f"prefix cache: achieved hit rate {_pct(pc.get('hit_rate'))}"
        if pc.get("intended_hit_rate") is not None:
            how = "primed" if pc.get("primed") else "cold"
            if not pc.get("primed") and not pc.get("flushed"):
                how += "; the cache was not flushed (--flush-cache): earlier runs' hits count"
            line += f" (intended {_pct(pc['intended_hit_rate'])}, {how})"
            if pc["intended_hit_rate"] > 0 and pc.get("hit_rate") == 0 and pc.get("primed"):
                # primed and not one hit: the server caches no prefixes (cbbench serve's default)
                line += (
                    "; not one hit after priming: is the server's prefix caching on? "
                    "(cbbench serve and vLLM: --enable-prefix-caching)"
                )
        out.append(line)
    ag = summary.get("agent")
    if ag:
        ms, tw = ag["makespan_s"], ag["tool_wait_s"]
        out.append(
            f"agent: {ag['sessions_finished']}/{ag['sessions']} sessions finished, "
            f"{ag['steps']} steps; makespan p50 {_s(ms['p50'])} p90 {_s(ms['p90'])}; tool waits "
            f"(not in any latency) p50 {_s(tw['p50'])}; step hit rate "
            f"{_pct(ag['prefix_cache_hit_rate'])}"
        )
    return [*out, *graph_lines(summary)]
