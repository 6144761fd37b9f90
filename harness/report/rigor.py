"""The report's run-level conclusions: each run's steady-state window beside its whole run,
and, for `--repeats` folders, each figure's mean with its t-interval and CV, and whether two
repeated configurations can be told apart (harness/conclusions/)."""

from __future__ import annotations

import json
import math
from html import escape
from pathlib import Path

from cbbench.harness.conclusions.repeats import (
    FIGURES,
    REPEATS_FILE,
    UNITS,
    aggregate,
    compare,
    figure,
    lead_summary,
)
from cbbench.harness.conclusions.window import steady_window, window_figures
from cbbench.harness.report.runs import LoadedRun
from cbbench.harness.results.summary import summarize

COMPARED = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "output_throughput")


def _ms(v) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1e3:.1f}"


def window_rows(runs: list[LoadedRun]) -> list[list[str]]:
    rows = []
    for lr in runs:
        w = steady_window(lr.run.records)
        whole = summarize(lr.run.records)
        if w is None:
            rows.append([lr.label, "none (too short or never level)", "–", *["–"] * 6])
            continue
        wf = window_figures(lr.run.records, w)

        def pair(block: str, q: str, wf=wf, whole=whole) -> str:
            return f"{_ms((wf.get(block) or {}).get(q))} / {_ms((whole.get(block) or {}).get(q))}"

        thr = (
            f"{wf.get('request_throughput') or 0:.2f} / {whole.get('request_throughput') or 0:.2f}"
        )
        label = f"{w.start_s:.1f}–{w.end_s:.1f} s" + (" ⚠" if w.warning else "")
        rows.append([
            lr.label, label, str(wf["counts"]["total"]), pair("ttft_s", "p50"),
            pair("ttft_s", "p99"), pair("tpot_s", "p50"), pair("tpot_s", "p99"),
            pair("e2e_s", "p99"), thr,
        ])  # fmt: skip
    return rows


HEAD = ["run", "steady window", "requests", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99",
        "E2E p99", "req/s"]  # fmt: skip


def window_section(runs: list[LoadedRun]) -> str:
    rows = window_rows(runs)
    head = "".join(f"<th>{escape(h)}</th>" for h in HEAD)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return (
        f"<table><tr>{head}</tr>{body}</table><p class=muted>window / whole run; latencies in "
        "ms. The steady window: requests in flight at their plateau, ramp-up and drain "
        "excluded (docs/rigor.md); shaded on the in-flight timeline. ⚠: shorter than a fifth "
        "of the run.</p>"
    )


def repeat_groups(runs: list[LoadedRun]) -> dict[str, list[LoadedRun]]:
    """The runs of each `--repeats` folder among `runs`, by folder."""
    groups: dict[str, list[LoadedRun]] = {}
    for lr in runs:
        folder = lr.run.dir.parent
        if lr.sweep and (folder / REPEATS_FILE).exists():
            groups.setdefault(str(folder), []).append(lr)
    return groups


def _index(folder: str) -> dict:
    try:
        index = json.loads((Path(folder) / REPEATS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return index if isinstance(index, dict) else {}


def _method(folder: str) -> str:
    return _index(folder).get("method") or "t-interval over run means"


def repeat_lines(runs: list[LoadedRun]) -> list[tuple[str, list[list[str]], list[str]]]:
    """Per repeats folder: (title, rows of figure/mean/interval/CV, comparison lines)."""
    groups, left_out = {}, {}
    for folder, members in repeat_groups(runs).items():
        excluded = set(_index(folder).get("excluded") or [])  # failed or over-saturated
        groups[folder] = [lr for lr in members if lr.run.dir.name not in excluded]
        left_out[folder] = excluded
    out = []
    figs = {k: p for k, p, _, _ in FIGURES}
    first = next(iter(groups.values()), None)
    for folder, members in groups.items():
        excluded = left_out[folder]
        summaries = [lr.meta.get("summary") or {} for lr in members]
        agg = aggregate(summaries)
        rows = []
        for key, iv in agg.items():
            scale, unit = (1e3, "ms") if UNITS[key] == "s" else (1.0, UNITS[key])
            if iv["n"] < 2:
                continue
            cv = "–" if iv["cv"] is None else f"{iv['cv']:.1%}"
            rows.append([key, f"{iv['mean'] * scale:.2f} {unit}",
                         f"[{iv['low'] * scale:.2f}, {iv['high'] * scale:.2f}]", cv])  # fmt: skip
        lines = []
        if first is not None and members is not first:
            for key in COMPARED:
                a = [figure(lead_summary(lr.meta.get("summary") or {}), figs[key]) for lr in first]
                b = [figure(lead_summary(s), figs[key]) for s in summaries]
                d = compare([x for x in a if x is not None], [x for x in b if x is not None], key)
                if d is not None:
                    lines.append(
                        f"{key}: {d.ratio - 1:+.1%} vs the first folder, interval "
                        f"[{d.low:+.1%}, {d.high:+.1%}]: "
                        + ("cannot tell apart" if d.verdict == "cannot tell" else d.verdict)
                    )
        title = f"{folder}: {len(members)} repeats ({_method(folder)})"
        if excluded:
            title += f"; {', '.join(sorted(excluded))} stopped, left out"
        out.append((title, rows, lines))
    return out


def repeats_section(runs: list[LoadedRun]) -> str:
    parts = []
    for title, rows, lines in repeat_lines(runs):
        body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
        parts.append(
            f"<h3>{escape(title)}</h3><table><tr><th>figure</th><th>mean</th><th>95% interval"
            f"</th><th>CV</th></tr>{body}</table>" + "".join(f"<p>{escape(x)}</p>" for x in lines)
        )
    return "".join(parts)


def rigor_markdown(runs: list[LoadedRun]) -> list[str]:
    lines = ["", "Steady window (window / whole run, ms):", ""]
    lines.append("| " + " | ".join(HEAD) + " |")
    lines.append("|---|---|" + "---:|" * (len(HEAD) - 2))
    lines += ["| " + " | ".join(r) + " |" for r in window_rows(runs)]
    for title, rows, cmp_lines in repeat_lines(runs):
        lines += ["", f"**{title}**", "", "| figure | mean | 95% interval | CV |",
                  "|---|---:|---:|---:|"]  # fmt: skip
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        lines += [f"- {x}" for x in cmp_lines]
    return lines
