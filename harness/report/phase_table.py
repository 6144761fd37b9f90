"""The report's per-phase rows (disaggregated servers): per run, p50 and p99 of prefill
queue, prefill, KV transfer, decode queue and decode, and the mean KV bytes per request
(run.json's summary `phases`, results/phases.py)."""

from __future__ import annotations

from html import escape

from cbbench.harness.report.runs import LoadedRun

PHASES = (
    ("prefill_queue_s", "prefill queue"), ("prefill_s", "prefill"),
    ("kv_transfer_s", "KV transfer"), ("decode_queue_s", "decode queue"), ("decode_s", "decode"),
)  # fmt: skip
HEAD = tuple(f"{t} p50/p99 (ms)" for _, t in PHASES) + ("KV bytes / request",)


def _cells(phases: dict) -> list[str]:
    def ms(stats: dict | None) -> str:
        if not stats or stats.get("p50") is None:
            return "–"
        return f"{stats['p50'] * 1e3:.1f} / {stats['p99'] * 1e3:.1f}"

    nbytes = (phases.get("kv_transfer_bytes") or {}).get("mean")
    return [ms(phases.get(k)) for k, _ in PHASES] + ["–" if nbytes is None else f"{nbytes:,.0f}"]


def phase_rows(runs: list[LoadedRun]) -> list[tuple[str, list[str]]]:
    out = []
    for lr in runs:
        phases = (lr.meta.get("summary") or {}).get("phases")
        if isinstance(phases, dict):
            out.append((lr.label + (" SIMULATED" if lr.simulated else ""), _cells(phases)))
    return out


def phase_markdown(runs: list[LoadedRun]) -> list[str]:
    rows = phase_rows(runs)
    if not rows:
        return []
    lines = ["", "Per-phase server times (prefill/decode disaggregation):", ""]
    lines.append("| run | " + " | ".join(HEAD) + " |")
    lines.append("|---|" + "---:|" * len(HEAD))
    lines += ["| " + " | ".join([name.replace("|", "\\|"), *c]) + " |" for name, c in rows]
    return lines


def phase_html(runs: list[LoadedRun]) -> str:
    rows = phase_rows(runs)
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
