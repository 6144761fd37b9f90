"""The `graph` part of a run summary: agent-graph sessions (records with `extra["graph"]`).

Per session: success (every call of its graph answered; a session the run's end cut short,
with no call failed, is `cut` and left out of `session_success`), makespan (its first call
ready -> its last call's last byte; successful sessions only), calls, fan-out width (the most
calls waiting on one call), its calls' prefix-cache hit rate (`session_hit_rate` over
sessions), and its critical path: from the call that ended last, back through the predecessor
that ended last, to a root. Along that path the makespan splits into time on the server (each
call's send -> last byte) and time waiting (the recorded tool/think waits, slots, the client):
`critical_path_server_s` + `critical_path_wait_s` = makespan. Per step (a call's depth in its
graph): count, TTFT p50, prefix-cache hit rate.
"""

from __future__ import annotations

from collections.abc import Sequence

from cbbench.harness.results.records import RequestRecord
from cbbench.workloads.stats import describe


def _hit_rate(recs: Sequence[RequestRecord]) -> float | None:
    cached = prompt = 0
    for r in recs:
        c = r.extra.get("num_cached_tokens")
        if isinstance(c, (int, float)) and r.prompt_tokens_server:
            cached += int(c)
            prompt += r.prompt_tokens_server
    return cached / prompt if prompt else None


def graph_sessions(records: Sequence[RequestRecord]) -> dict[str, list[RequestRecord]]:
    out: dict[str, list[RequestRecord]] = {}
    for r in records:
        if not r.warmup and isinstance(r.extra.get("graph"), dict):
            out.setdefault(r.session_id or r.id, []).append(r)
    return out


def session_figures(recs: Sequence[RequestRecord]) -> dict:
    """One session's figures (see the module docstring)."""
    planned = max(int(r.extra["graph"].get("calls") or 1) for r in recs)
    ok = len(recs) == planned and all(r.ok for r in recs)
    succ: dict[int, int] = {}
    for r in recs:
        for p in r.extra["graph"].get("after") or ():
            succ[p] = succ.get(p, 0) + 1
    fig: dict = {
        "session_id": recs[0].session_id,
        "success": ok,
        "cut": not ok and all(r.ok for r in recs),  # the run ended first (no call failed)
        "calls": planned,
        "calls_answered": sum(r.ok for r in recs),
        "fan_out_width": max(succ.values(), default=1),
        "prefix_cache_hit_rate": _hit_rate([r for r in recs if r.ok]),
        "makespan_s": None,
        "critical_path_server_s": None,
        "critical_path_wait_s": None,
        "critical_path_calls": None,
    }
    if not ok or any(r.ready_s is None or r.end_s is None or r.sent_s is None for r in recs):
        return fig
    by_index = {r.index: r for r in recs}
    start = min(r.ready_s for r in recs)  # type: ignore[type-var]
    last = max(recs, key=lambda r: r.end_s)  # type: ignore[arg-type,return-value]
    makespan = last.end_s - start  # type: ignore[operator]
    server = 0.0
    path = 0
    node: RequestRecord | None = last
    while node is not None:
        server += node.end_s - node.sent_s  # type: ignore[operator]
        path += 1
        preds = [by_index[p] for p in node.extra["graph"].get("after") or () if p in by_index]
        node = max(preds, key=lambda r: r.end_s) if preds else None  # type: ignore[arg-type,return-value]
    fig.update(
        makespan_s=makespan,
        critical_path_server_s=server,
        critical_path_wait_s=max(0.0, makespan - server),
        critical_path_calls=path,
    )
    return fig


def graph_makespans(records: Sequence[RequestRecord]) -> list[float]:
    """Each successful graph session's makespan (for gates and reports)."""
    out = []
    for recs in graph_sessions(records).values():
        m = session_figures(recs)["makespan_s"]
        if m is not None:
            out.append(m)
    return out


def graph_session_success(records: Sequence[RequestRecord]) -> list[bool]:
    """Per session that ended (not cut by the run's end): did every call answer?"""
    figs = [session_figures(recs) for recs in graph_sessions(records).values()]
    return [f["success"] for f in figs if not f["cut"]]


def graph_summary(records: Sequence[RequestRecord]) -> dict | None:
    """None when no record is a graph call."""
    sessions = graph_sessions(records)
    if not sessions:
        return None
    figs = [session_figures(recs) for recs in sessions.values()]
    calls = [r for recs in sessions.values() for r in recs]
    ok = [r for r in calls if r.ok]
    by_step = {}
    for depth in sorted({int(r.extra["graph"].get("depth") or 0) for r in ok}):
        rs = [r for r in ok if int(r.extra["graph"].get("depth") or 0) == depth]
        by_step[str(depth + 1)] = {
            "count": len(rs),
            "ttft_p50_s": describe(r.ttft_s for r in rs)["p50"],
            "prefix_cache_hit_rate": _hit_rate(rs),
        }
    good = [f for f in figs if f["success"]]
    ended = [f for f in figs if not f["cut"]]
    waits = [r.extra["graph"].get("wait_s") for r in calls]
    return {
        "sessions": len(figs),
        "sessions_succeeded": len(good),
        "sessions_cut": len(figs) - len(ended),  # the run ended before their last call
        "session_success": len(good) / len(ended) if ended else None,
        "calls": len(calls),
        "calls_answered": len(ok),
        "makespan_s": describe(f["makespan_s"] for f in good),
        "critical_path_server_s": describe(f["critical_path_server_s"] for f in good),
        "critical_path_wait_s": describe(f["critical_path_wait_s"] for f in good),
        "calls_per_session": describe(f["calls"] for f in figs),
        "fan_out_width": describe(f["fan_out_width"] for f in figs),
        "wait_s": describe(w for w in waits if isinstance(w, (int, float))),
        "ttft_s": describe(r.ttft_s for r in ok),
        "prefix_cache_hit_rate": _hit_rate(ok),
        "session_hit_rate": describe(f["prefix_cache_hit_rate"] for f in figs),
        "by_step": by_step,
    }


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f} s"


def graph_lines(summary: dict) -> list[str]:
    """What the run printed about agent-graph sessions (nothing without them)."""
    g = summary.get("graph")
    if not g:
        return []
    ms, cs, cw = g["makespan_s"], g["critical_path_server_s"], g["critical_path_wait_s"]
    hit = g["prefix_cache_hit_rate"]
    rate = "" if g["session_success"] is None else f" ({100 * g['session_success']:.1f} %)"
    cut = f" ({g['sessions_cut']} cut by the run's end)" if g["sessions_cut"] else ""
    steps = ", ".join(
        f"{k}: {v['ttft_p50_s'] * 1000:.0f} ms" if v["ttft_p50_s"] is not None else f"{k}: -"
        for k, v in list(g["by_step"].items())[:6]
    )
    return [
        f"agent graphs: {g['sessions_succeeded']}/{g['sessions'] - g['sessions_cut']} sessions "
        f"succeeded{rate}{cut}, {g['calls']} calls, calls/session p50 "
        f"{g['calls_per_session']['p50']:g}, fan-out width max {g['fan_out_width']['max']:g}",
        f"  makespan p50 {_s(ms['p50'])} p90 {_s(ms['p90'])}; critical path p50: "
        f"{_s(cs['p50'])} on the server, {_s(cw['p50'])} waiting; call hit rate "
        + ("-" if hit is None else f"{100 * hit:.1f} %"),
        f"  TTFT p50 by step: {steps}",
    ]
