"""One self-contained HTML file: inline CSS, inline SVG charts, no JavaScript, no network.

Every string that comes from a result file goes through `html.escape`; the machine-readable
summary embedded in a `<script type="application/json">` is escaped with `json_for_script`.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from html import escape
from typing import Any

from cbbench.harness.report import plots
from cbbench.harness.report.agent_table import agent_html
from cbbench.harness.report.experts import expert_section
from cbbench.harness.report.graph_report import graph_html
from cbbench.harness.report.phase_table import phase_html
from cbbench.harness.report.provenance import grouped
from cbbench.harness.report.replicas import replica_section
from cbbench.harness.report.rigor import repeat_groups, repeats_section, window_section
from cbbench.harness.report.runs import (
    LoadedRun,
    comparability_warnings,
    flatten,
    load_level,
    sweep_answers,
    timing_warnings,
    trust_warnings,
    workload_identity,
)
from cbbench.harness.report.samples import LATENCY_METRICS, RunSamples
from cbbench.harness.report.table import (
    LATENCY_TITLES,
    SERVER_COLUMNS_FROM,
    STAT_KEYS,
    best_index,
    fmt,
    fmt_column,
    shown_columns,
    slo_seconds,
)
from cbbench.harness.report.time_split_section import time_split_html

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:6px 0;font-variant-numeric:tabular-nums}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#f4f5f7}td.name,th.name{text-align:left}
td.best{background:#e3f4e1;font-weight:600}td.best::after{content:" \\2605";color:#2e7d32}
tr.diff td{background:#fff7e0}.scroll{overflow-x:auto}
.sim{background:#b71c1c;color:#fff;border-radius:3px;padding:1px 6px;font-size:12px;font-weight:700}
.warn{background:#fff3cd;border:1px solid #e0c36c;padding:8px 12px;margin:10px 0;border-radius:4px}
.grid{display:flex;flex-wrap:wrap;gap:12px}.grid svg{border:1px solid #eee;background:#fff}
svg text{font:11px system-ui,sans-serif;fill:#333}svg .ct{font-size:13px;font-weight:600;text-anchor:middle}
svg .xt,svg .xl,svg .empty{text-anchor:middle}svg .yt{text-anchor:end}svg .yl{text-anchor:middle}
svg .axes rect{fill:none;stroke:#999}svg .axes line{stroke:#eee}
.muted{color:#777}code{background:#f4f5f7;padding:0 3px}
.finding{border-left:3px solid #e0a800;padding:2px 10px;margin:8px 0}
.finding td{white-space:normal;max-width:900px}
.finding details{margin:4px 0}.finding summary{cursor:pointer;color:#555}
#summary th{white-space:normal;vertical-align:bottom;min-width:3.5em}
#summary th,#summary td{padding:3px 5px}
#config{table-layout:fixed;width:100%}#config th:first-child{width:22%}
#config td{white-space:normal;overflow-wrap:anywhere;vertical-align:top}
"""


def json_for_script(obj: Any) -> str:
    """JSON safe inside <script>: no '<', '>' or '&' survive literally (so no '</script>')."""
    text = json.dumps(obj, default=str, allow_nan=False)
    return (
        text.replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _name_cell(lr: LoadedRun) -> str:
    sim = ' <span class="sim">SIMULATED</span>' if lr.simulated else ""
    return f'<td class="name">{escape(lr.label)}{sim}</td>'


def _lines(lines: list[str]) -> str:
    if not lines:
        return ""
    return '<ul class="muted">' + "".join(f"<li>{escape(x)}</li>" for x in lines) + "</ul>"


def _summary_table(runs: list[LoadedRun], rows: list[dict]) -> str:
    """Two tables, so that each fits 1,400 px: the run's figures (load, latency, errors), then
    the server's (KV cache, GPU, batch, energy, cost, replicas) when a run has them."""
    columns = shown_columns(rows)
    split = next((i for i, c in enumerate(columns) if c.key == SERVER_COLUMNS_FROM), len(columns))
    server = columns[split:]
    return _columns_table(runs, rows, columns[:split], "summary", "run") + (
        _columns_table(runs, rows, server, "summary-server", "server") if server else ""
    )


def _columns_table(
    runs: list[LoadedRun], rows: list[dict], columns: list, table_id: str, first: str
) -> str:
    head = "".join(
        f"<th>{escape(c.title)}{' (ms)' if c.unit == 'ms' else ''}</th>" for c in columns
    )
    body = []
    text = {c.key: fmt_column([r.get(c.key) for r in rows], c.unit) for c in columns}
    best = {c.key: best_index([r.get(c.key) for r in rows], c.better, text[c.key]) for c in columns}
    for i, lr in enumerate(runs):
        cells = "".join(
            f"<td{' class=best' if i in best[c.key] else ''}>{escape(text[c.key][i])}</td>"
            for c in columns
        )
        body.append(f"<tr>{_name_cell(lr)}{cells}</tr>")
    return (
        f'<div class="scroll"><table id="{table_id}"><tr><th class="name">{first}</th>{head}'
        f"</tr>{''.join(body)}</table></div>"
    )


def _percentile_tables(runs: list[LoadedRun], rows: list[dict]) -> str:
    out = []
    for m in LATENCY_METRICS:
        if m == "ttfo" and all(r.get("ttfo.p50") is None for r in rows):
            continue  # no run reasoned: TTFO is TTFT
        head = "".join(f"<th>{k}</th>" for k in STAT_KEYS) + "<th>count</th>"
        best = {
            k: best_index(
                [r.get(f"{m}.{k}") for r in rows],
                "low",
                [fmt(r.get(f"{m}.{k}"), "ms") for r in rows],
            )
            for k in STAT_KEYS
        }
        body = []
        for i, (lr, row) in enumerate(zip(runs, rows, strict=True)):
            cells = "".join(
                f"<td{' class=best' if i in best[k] else ''}>{fmt(row.get(f'{m}.{k}'), 'ms')}</td>"
                for k in STAT_KEYS
            )
            body.append(f"<tr>{_name_cell(lr)}{cells}<td>{row.get(f'{m}.count', 0)}</td></tr>")
        out.append(
            f'<table class="pct"><tr><th class="name">{LATENCY_TITLES[m]} (ms)</th>{head}</tr>'
            f"{''.join(body)}</table>"
        )
    return '<div class="grid">' + "".join(out) + "</div>"


def _errors(runs: list[LoadedRun]) -> str:
    out = []
    for lr in runs:
        errs = [r for r in lr.run.records if not r.ok and not r.warmup]
        if not errs:
            continue
        kinds = Counter((r.error_kind or "unknown", (r.error or "")[:200]) for r in errs)
        items = "".join(
            f"<li><code>{escape(k)}</code> ×{n}: {escape(msg)}</li>"
            for (k, msg), n in kinds.most_common(5)
        )
        out.append(f"<p><b>{escape(lr.label)}</b>: {len(errs)} failed</p><ul>{items}</ul>")
    return "".join(out) or '<p class="muted">no failed requests</p>'


def _config_table(runs: list[LoadedRun]) -> str:
    flat = [flatten(lr.meta, skip=("summary",)) for lr in runs]
    keys = sorted({k for f in flat for k in f})
    head = "".join(f"<th class=name>{escape(lr.label)}</th>" for lr in runs)
    body = []
    for k in keys:
        vals = [f.get(k, "–") for f in flat]
        cls = ' class="diff"' if len(runs) > 1 and len(set(vals)) > 1 else ""
        cells = "".join(f'<td class="name">{escape(str(v))}</td>' for v in vals)
        body.append(f'<tr{cls}><td class="name"><code>{escape(k)}</code></td>{cells}</tr>')
    return (
        '<div class="scroll"><table id="config"><tr><th class="name">setting</th>'
        f"{head}</tr>{''.join(body)}</table></div>"
    )


def _slo_note(runs: list[LoadedRun]) -> str:
    """The SLO goodput was counted against, said once ('goodput: requests within TTFT 500 ms
    and TPOT 50 ms'); per run when they differ; runs without one are named, since their
    goodput cell is empty for that reason."""

    def said(slo: dict[str, float]) -> str:
        return " and ".join(f"{k.upper()} {v * 1e3:g} ms" for k, v in slo.items())

    slos = {escape(lr.label): slo_seconds(lr.meta) for lr in runs}
    given = {k: v for k, v in slos.items() if v}
    missing = [k for k, v in slos.items() if not v]
    parts = []
    if len({said(v) for v in given.values()}) == 1:
        parts.append(f"Goodput: requests within {said(next(iter(given.values())))}")
    elif given:
        parts.append("Goodput: requests within " + "; ".join(
            f"{said(v)} ({k})" for k, v in given.items()))  # fmt: skip
    if missing:
        who = "" if not given else " for " + ", ".join(missing)
        parts.append(f"goodput needs an SLO (<code>--slo</code>){who}")
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "." if text else ""


def render(
    runs: list[LoadedRun], samples: list[RunSamples], rows: list[dict], diagnosis: str = ""
) -> str:
    """`diagnosis`: the "Diagnosis" section's HTML (harness.diagnose.render.html), if any."""
    assert runs and len(runs) == len(samples) == len(rows)
    warnings = comparability_warnings(runs)
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    n_sim = sum(lr.simulated for lr in runs)
    sim_note = (
        f'<p class="warn"><span class="sim">SIMULATED</span> {n_sim} of {len(runs)} runs come from the'
        " simulator (modelled step times, virtual clock), not from a measured server.</p>"
        if n_sim
        else ""
    )
    common, own = grouped(runs)
    run_list = "".join(
        f"<li>{escape(lr.label)}{' <span class=sim>SIMULATED</span>' if lr.simulated else ''}"
        f" — workload <code>{escape(str(workload_identity(lr.meta)[0]))}</code>, seed "
        f"<code>{escape(str(workload_identity(lr.meta)[1]))}</code>"
        f"{', ' + escape(load_level(lr.meta)) if load_level(lr.meta) else ''}{_lines(mine)}</li>"
        for lr, mine in zip(runs, own, strict=True)
    )
    if common:
        run_list += f"<li>all runs{_lines(common)}</li>"
    warn_html = "".join(f'<p class="warn">Not comparable: {escape(w)}</p>' for w in warnings)
    warn_html += "".join(
        f'<p class="warn">Read with care: {escape(w)}</p>'
        for w in comparability_warnings(runs, "caution")
    )
    warn_html += "".join(
        f'<p class="warn">Incomplete: {escape(w)}</p>' for w in trust_warnings(runs)
    )
    warn_html += "".join(f'<p class="warn">Timing: {escape(w)}</p>' for w in timing_warnings(runs))
    warn_html += "".join(f"<p>Sweep: {escape(w)}</p>" for w in sweep_answers(runs))
    sections = [
        (
            "Summary",
            _summary_table(runs, rows)
            + '<p class="muted">★ the one best value per column (none for a tie or a difference'
            " below the printed precision; KV usage and GPU utilization are not ranked: neither"
            f" more nor less is better in itself). Latencies in ms. {_slo_note(runs)}</p>",
        ),
        *([("Diagnosis", diagnosis)] if diagnosis else []),
        ("Steady-state window", window_section(runs)),
        *([("Repeated runs", repeats_section(runs))] if repeat_groups(runs) else []),
        ("Latency percentiles", _percentile_tables(runs, rows)),
        (
            "Latency distributions",
            '<div class="grid">' + "".join(plots.cdf_charts(runs, samples)) + "</div>",
        ),
    ]
    if len(runs) > 1:
        sections.append(
            (
                "Latency vs throughput",
                '<div class="grid">'
                + "".join(plots.curve_charts(runs, samples, rows))
                + plots.goodput_chart(runs)
                + "</div>",
            )
        )
    turn_charts = plots.session_charts(runs)
    if turn_charts:
        sections.append(
            (
                "Sessions",
                '<div class="grid">' + "".join(turn_charts) + "</div>"
                '<p class="muted">Multi-turn sessions: each turn resends the history. TTFT of'
                " later turns shows what the prefix cache saves (or the cost of re-prefilling"
                " the history without one).</p>",
            )
        )
    replicas = replica_section(runs)
    if replicas:
        sections.append(("Replicas", replicas))
    experts = expert_section(runs)
    if experts:
        sections.append(("Expert load", experts))
    if agent_html(runs):
        sections.append(("Agent sessions", agent_html(runs)))
    if time_split_html(runs):
        sections.append(("Where the time went (the server's own times)", time_split_html(runs)))
    if graph_html(runs):
        sections.append(("Agent graphs", graph_html(runs)))
    if phase_html(runs):
        sections.append(("Per-phase server times", phase_html(runs)))
    sections += [
        (
            "Timelines",
            '<div class="grid">' + "".join(plots.timeline_charts(runs, samples)) + "</div>",
        ),
        ("Per request", '<div class="grid">' + plots.scatter_chart(runs, samples) + "</div>"),
        ("Errors", _errors(runs)),
        ("Configuration and environment", _config_table(runs)),
    ]
    data = {
        "runs": [
            {"label": lr.label, "name": lr.run.name, "simulated": lr.simulated, "summary": row}
            for lr, row in zip(runs, rows, strict=True)
        ],
        "warnings": warnings,
    }
    body = "".join(f"<h2>{escape(t)}</h2>{html}" for t, html in sections)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>cbbench report ({len(runs)} run{'s' if len(runs) > 1 else ''})</title>"
        f"<style>{CSS}</style></head><body>"
        f"<h1>cbbench report</h1><p class=muted>generated {now}</p><ul>{run_list}</ul>"
        f"{sim_note}{warn_html}{body}"
        f'<script type="application/json" id="cbbench-data">{json_for_script(data)}</script>'
        "</body></html>\n"
    )
