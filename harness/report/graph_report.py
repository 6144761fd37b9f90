"""The report's agent-graph part: per run, sessions succeeded, makespan, the critical path
split into time on the server and time waiting, calls per session, fan-out width, call TTFT
and hit rate (run.json's `graph`); and a Gantt chart of a few sessions (inline SVG, like the
other plots): one row per call, its wait before sending (grey) and its time on the server
(send -> last byte, colored, a tick at the first token), time from the session's start.
"""

from __future__ import annotations

from html import escape

from cbbench.harness.report.runs import LoadedRun
from cbbench.harness.report.svg import color, nice_ticks
from cbbench.harness.results.graph_summary import graph_sessions

HEAD = (
    "sessions succeeded", "makespan p50 (s)", "makespan p90 (s)", "critical path on server p50 (s)",
    "critical path waiting p50 (s)", "calls/session p50", "fan-out max", "call TTFT p50 (ms)",
    "call hit rate",
)  # fmt: skip
GANTT_SESSIONS = 3
ROW_H, PAD_L, PAD_T, WIDTH = 14, 110, 30, 580


def _cells(g: dict) -> list[str]:
    def s(x, scale=1.0, digits=2):
        return "–" if x is None else f"{x * scale:.{digits}f}"

    hit = g.get("prefix_cache_hit_rate")
    return [
        f"{g['sessions_succeeded']}/{g['sessions'] - g.get('sessions_cut', 0)}",
        s(g["makespan_s"]["p50"]),
        s(g["makespan_s"]["p90"]),
        s(g["critical_path_server_s"]["p50"]),
        s(g["critical_path_wait_s"]["p50"]),
        s(g["calls_per_session"]["p50"], digits=0),
        s(g["fan_out_width"]["max"], digits=0),
        s(g["ttft_s"]["p50"], 1e3, 1),
        "–" if hit is None else f"{100 * hit:.1f} %",
    ]


def graph_rows(runs: list[LoadedRun]) -> list[tuple[str, list[str]]]:
    out = []
    for lr in runs:
        g = (lr.meta.get("summary") or {}).get("graph")
        if isinstance(g, dict):
            out.append((lr.label + (" SIMULATED" if lr.simulated else ""), _cells(g)))
    return out


def graph_markdown(runs: list[LoadedRun]) -> list[str]:
    rows = graph_rows(runs)
    if not rows:
        return []
    lines = ["", "Agent graph sessions (critical path = on the server + waiting):", ""]
    lines.append("| run | " + " | ".join(HEAD) + " |")
    lines.append("|---|" + "---:|" * len(HEAD))
    lines += ["| " + " | ".join([name.replace("|", "\\|"), *c]) + " |" for name, c in rows]
    return lines


def gantt_svg(lr: LoadedRun, limit: int = GANTT_SESSIONS) -> str:
    """A Gantt chart of the first `limit` graph sessions of a run ('' without any)."""
    sessions = list(graph_sessions(lr.run.records).items())[:limit]
    sessions = [(sid, recs) for sid, recs in sessions if any(r.sent_s is not None for r in recs)]
    if not sessions:
        return ""
    rows: list[tuple[str, object, float]] = []  # (label, record, session start)
    for sid, recs in sessions:
        start = min(r.ready_s for r in recs if r.ready_s is not None)
        for r in sorted(recs, key=lambda r: r.index):
            rows.append((f"{sid} {r.extra['graph'].get('name') or r.index}", r, start))
    span = max((r.end_s or r.sent_s or 0) - start for _, r, start in rows) or 1.0  # type: ignore[attr-defined]
    ticks = nice_ticks(0.0, span)
    span = max(span, ticks[-1])
    pw = WIDTH - PAD_L - 16
    height = PAD_T + ROW_H * len(rows) + 40

    def sx(t: float) -> float:
        return PAD_L + pw * t / span

    title = f"{lr.label}: agent graph sessions (Gantt)"
    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}"'
        f' viewBox="0 0 {WIDTH} {height}" role="img" data-calls="{len(rows)}">'
        f"<title>{escape(title)}</title>",
        f'<text x="{WIDTH / 2}" y="18" class="ct">{escape(title)}</text>',
    ]
    sessions_seen: dict[str, int] = {}
    for k, (label, r, start) in enumerate(rows):
        y = PAD_T + k * ROW_H
        sid = label.split(" ")[0]
        c = color(sessions_seen.setdefault(sid, len(sessions_seen)))
        parts.append(
            f'<text x="{PAD_L - 4}" y="{y + ROW_H - 3}" class="yt">{escape(label[:18])}</text>'
        )
        ready, sent, end = r.ready_s, r.sent_s, r.end_s  # type: ignore[attr-defined]
        if ready is not None and sent is not None and sent > ready:
            parts.append(
                f'<rect x="{sx(ready - start):.1f}" y="{y + 4}" width="{sx(sent - start) - sx(ready - start):.1f}"'
                f' height="{ROW_H - 8}" fill="#ccc"><title>waiting {sent - ready:.3f} s</title></rect>'
            )
        if sent is not None and end is not None:
            tip = f"{label}: on the server {end - sent:.3f} s" + ("" if r.ok else " (failed)")  # type: ignore[attr-defined]
            parts.append(
                f'<rect x="{sx(sent - start):.1f}" y="{y + 2}" width="{max(1.0, sx(end - start) - sx(sent - start)):.1f}"'
                f' height="{ROW_H - 4}" fill="{c if r.ok else "#d62728"}"><title>{escape(tip)}</title></rect>'  # type: ignore[attr-defined]
            )
            first = r.first_token_s  # type: ignore[attr-defined]
            if first is not None:
                parts.append(
                    f'<line x1="{sx(first - start):.1f}" x2="{sx(first - start):.1f}" y1="{y + 1}"'
                    f' y2="{y + ROW_H - 1}" stroke="#000"/>'
                )
    base = PAD_T + ROW_H * len(rows)
    for t in ticks:
        parts.append(f'<text x="{sx(t):.1f}" y="{base + 14}" class="xt">{t:g}</text>')
    parts.append(
        f'<text x="{PAD_L + pw / 2}" y="{base + 32}" class="xl">seconds from the session start'
        " (grey: waiting; color: on the server; tick: first token)</text></svg>"
    )
    return "".join(parts)


def graph_html(runs: list[LoadedRun]) -> str:
    rows = graph_rows(runs)
    if not rows:
        return ""
    head = "".join(f"<th>{escape(h)}</th>" for h in HEAD)
    body = "".join(
        f"<tr><td class=name>{escape(n)}</td>"
        + "".join(f"<td>{escape(x)}</td>" for x in c)
        + "</tr>"
        for n, c in rows
    )
    gantts = "".join(gantt_svg(lr) for lr in runs)
    return (
        f'<div class="scroll"><table><tr><th class="name">run</th>{head}</tr>{body}</table></div>'
        + (f'<div class="grid">{gantts}</div>' if gantts else "")
    )
