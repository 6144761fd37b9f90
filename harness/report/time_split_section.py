"""The report's "where the time went" lines: each run whose records carry the server's own
per-request times (summary.server_timing, harness/results/time_split.py)."""

from __future__ import annotations

from html import escape

from cbbench.harness.report.runs import LoadedRun
from cbbench.harness.results.time_split import time_split_line


def time_split_lines(runs: list[LoadedRun]) -> list[tuple[str, str]]:
    """(run label, line) per run that has the server's times."""
    out = []
    for lr in runs:
        line = time_split_line((lr.meta.get("summary") or {}).get("server_timing"))
        if line:
            out.append((lr.label, line))
    return out


def time_split_html(runs: list[LoadedRun]) -> str:
    rows = time_split_lines(runs)
    return "".join(f"<p><b>{escape(label)}</b>: {escape(line)}</p>" for label, line in rows)
