"""The report's agent-session rows: per run, sessions finished, makespan, tool waits (apart
from every latency), step TTFT and the steps' prefix-cache hit rate (run.json's `agent`)."""

from __future__ import annotations

from html import escape

from cbbench.harness.report.runs import LoadedRun

HEAD = (
    "sessions finished", "makespan p50 (s)", "makespan p90 (s)", "tool wait p50 (s)",
    "step TTFT p50 (ms)", "step hit rate",
)  # fmt: skip


def _cells(agent: dict) -> list[str]:
    def s(x, scale=1.0, digits=2):
        return "–" if x is None else f"{x * scale:.{digits}f}"

    hit = agent.get("prefix_cache_hit_rate")
    return [
        f"{agent['sessions_finished']}/{agent['sessions']}",
        s(agent["makespan_s"]["p50"]),
        s(agent["makespan_s"]["p90"]),
        s(agent["tool_wait_s"]["p50"]),
        s(agent["ttft_s"]["p50"], 1e3, 1),
        "–" if hit is None else f"{100 * hit:.1f} %",
    ]


def agent_rows(runs: list[LoadedRun]) -> list[tuple[str, list[str]]]:
    out = []
    for lr in runs:
        agent = (lr.meta.get("summary") or {}).get("agent")
        if isinstance(agent, dict):
            out.append((lr.label + (" SIMULATED" if lr.simulated else ""), _cells(agent)))
    return out


def agent_markdown(runs: list[LoadedRun]) -> list[str]:
    rows = agent_rows(runs)
    if not rows:
        return []
    lines = ["", "Agent sessions (tool waits are never inside a latency):", ""]
    lines.append("| run | " + " | ".join(HEAD) + " |")
    lines.append("|---|" + "---:|" * len(HEAD))
    lines += ["| " + " | ".join([name.replace("|", "\\|"), *c]) + " |" for name, c in rows]
    return lines


def agent_html(runs: list[LoadedRun]) -> str:
    rows = agent_rows(runs)
    if not rows:
        return ""
    head = "".join(f"<th>{escape(h)}</th>" for h in HEAD)
    body = "".join(
        f"<tr><td class=name>{escape(n)}</td>"
        + "".join(f"<td>{escape(x)}</td>" for x in c)
        + "</tr>"
        for n, c in rows
    )
    return (
        f'<div class="scroll"><table><tr><th class="name">run</th>{head}</tr>{body}</table></div>'
    )
