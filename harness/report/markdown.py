"""A Markdown summary sized for a pull-request comment: one table and deltas vs the first run."""

from __future__ import annotations

from html import escape

from cbbench.harness.report.agent_table import agent_markdown
from cbbench.harness.report.graph_report import graph_markdown
from cbbench.harness.report.phase_table import phase_markdown
from cbbench.harness.report.provenance import grouped
from cbbench.harness.report.rigor import rigor_markdown
from cbbench.harness.report.runs import (
    LoadedRun,
    comparability_warnings,
    sweep_answers,
    timing_warnings,
    trust_warnings,
)
from cbbench.harness.report.table import SUMMARY_COLUMNS, Column, best_index, fmt_column
from cbbench.harness.report.time_split_section import time_split_lines

MD_KEYS = (
    "request_throughput",
    "output_throughput",
    "goodput",
    "ttft.p50",
    "ttft.p99",
    "ttfo.p50",  # when a run reasoned (else TTFO is TTFT: the column is left out)
    "tpot.p50",
    "tpot.p99",
    "e2e.p99",
    "error_rate",
)
DELTA_KEYS = ("output_throughput", "ttft.p50", "ttft.p99", "tpot.p99", "e2e.p99", "error_rate")


def md_text(text: str) -> str:
    """Text safe in a GitHub table cell: no HTML, no pipes, no line breaks."""
    return escape(" ".join(str(text).split()), quote=False).replace("|", "\\|").replace("`", "'")


OPTIONAL_MD_KEYS = (
    "output_tokens_per_j",
    "usd_per_1m_output_tokens",
    "replica_load_max_over_mean",
)  # when a run has them


def _columns(rows: list[dict] | None = None) -> list[Column]:
    by_key = {c.key: c for c in SUMMARY_COLUMNS}
    rows = rows or []
    keys = [k for k in MD_KEYS if not by_key[k].optional or any(r.get(k) is not None for r in rows)]
    extra = [k for k in OPTIONAL_MD_KEYS if any(r.get(k) is not None for r in rows)]
    return [by_key[k] for k in (*keys, *extra)]


def _delta(base: float | None, value: float | None, better: str | None, unit: str) -> str:
    if base is None or value is None:
        return "–"
    if unit == "%":  # fractions (error rate): the change in percentage points
        return f"{(value - base) * 100:+.1f} pp"
    if base == 0:
        return "±0" if value == 0 else f"{value:+.3g} (from 0)"
    change = value / base - 1.0
    if abs(change) < 0.005:
        return f"{change:+.1%}"
    good = (change > 0) == (better == "high")
    return f"{change:+.1%} {'better' if good else 'worse'}"


def render_markdown(runs: list[LoadedRun], rows: list[dict]) -> str:
    cols = _columns(rows)
    lines = ["### cbbench report", ""]
    for w in comparability_warnings(runs):
        lines.append(f"- **Not comparable:** {md_text(w)}")
    for w in comparability_warnings(runs, "caution"):
        lines.append(f"- **Read with care:** {md_text(w)}")
    for w in trust_warnings(runs):
        lines.append(f"- **Incomplete:** {md_text(w)}")
    for w in timing_warnings(runs):
        lines.append(f"- **Timing:** {md_text(w)}")
    lines += [f"- **Sweep:** {md_text(w)}" for w in sweep_answers(runs)]
    if any(lr.simulated for lr in runs):
        lines.append("- Runs marked **SIMULATED** come from the simulator, not a measured server.")
    common, own = grouped(runs)
    lines += [f"- all runs: {md_text(line)}" for line in common]
    for lr, mine in zip(runs, own, strict=True):
        lines += [f"- {md_text(lr.label)}: {md_text(line)}" for line in mine]
    if lines[-1] != "":
        lines.append("")
    head = ["run"] + [c.title + (" (ms)" if c.unit == "ms" else "") for c in cols]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" + "---:|" * len(cols))
    text = {c.key: fmt_column([r.get(c.key) for r in rows], c.unit) for c in cols}
    best = {c.key: best_index([r.get(c.key) for r in rows], c.better, text[c.key]) for c in cols}
    for i, lr in enumerate(runs):
        name = md_text(lr.label) + (" **SIMULATED**" if lr.simulated else "")
        cells = [f"**{text[c.key][i]}**" if i in best[c.key] else text[c.key][i] for c in cols]
        lines.append("| " + " | ".join([name, *cells]) + " |")
    lines += rigor_markdown(runs)  # before the deltas: their rows close the page's tables
    if len(runs) > 1:
        by_key = {c.key: c for c in SUMMARY_COLUMNS}
        lines += ["", f"Deltas vs **{md_text(runs[0].label)}**:", ""]
        lines.append("| run | " + " | ".join(by_key[k].title for k in DELTA_KEYS) + " |")
        lines.append("|---|" + "---:|" * len(DELTA_KEYS))
        for lr, row in zip(runs[1:], rows[1:], strict=True):
            cells = [
                _delta(rows[0].get(k), row.get(k), by_key[k].better, by_key[k].unit)
                for k in DELTA_KEYS
            ]
            lines.append("| " + " | ".join([md_text(lr.label), *cells]) + " |")
    lines += agent_markdown(runs)
    lines += graph_markdown(runs)
    lines += phase_markdown(runs)
    split = time_split_lines(runs)
    if split:
        lines += ["", *(f"- {md_text(label)}: {md_text(line)}" for label, line in split)]
    lines += ["", "Best value per column in **bold**; latencies in ms."]
    return "\n".join(lines) + "\n"
