"""The expert-load heatmap of MoE runs: per run and layer, one row per expert and one column
per interval of the run, shaded by the expert's share of that interval's tokens relative
to an even share (white: none, light: even, darkest: 3x even or more), from the
`source: "experts"` samples (telemetry/experts.py)."""

from __future__ import annotations

from html import escape
from typing import Any

from cbbench.harness.report.runs import LoadedRun

MAX_COLUMNS = 120  # intervals per heatmap (neighbours merged beyond)
CELL, LEFT, TOP = 6, 64, 34


def expert_intervals(lr: LoadedRun) -> tuple[list[float], dict[str, list[list[float]]]]:
    """(interval end times, layer -> [tokens per expert] per interval) of one run."""
    pts = sorted(
        (float(s["t_s"]), s["experts"])
        for s in lr.run.timeseries
        if s.get("source") == "experts"
        and isinstance(s.get("experts"), dict)
        and isinstance(s.get("t_s"), (int, float))
    )
    times: list[float] = []
    grids: dict[str, list[list[float]]] = {}
    for (_, a), (t, b) in zip(pts, pts[1:], strict=False):
        times.append(t)
        for layer, now in b.items():
            before = a.get(layer) or []
            row = [n - (before[e] if e < len(before) else 0.0) for e, n in enumerate(now)]
            grids.setdefault(layer, []).append([max(0.0, x) for x in row])
    step = max(1, -(-len(times) // MAX_COLUMNS))
    if step > 1:  # merge neighbouring intervals
        times = times[step - 1 :: step] + ([times[-1]] if len(times) % step else [])
        for layer, cols in grids.items():
            grids[layer] = [
                [sum(c[e] for c in cols[i : i + step]) for e in range(len(cols[0]))]
                for i in range(0, len(cols), step)
            ]
    return times, grids


def heatmap(lr: LoadedRun) -> str:
    times, grids = expert_intervals(lr)
    if not grids or not times:
        return ""
    n_cols = len(times)
    layers = list(grids)
    experts = max(len(c[0]) for c in grids.values())
    height = TOP + len(layers) * (experts + 1) * CELL + 24
    width = LEFT + n_cols * CELL + 16
    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" data-layers="{len(layers)}" data-experts="{experts}" '
        f'data-columns="{n_cols}"><title>expert load over time: {escape(lr.label)}</title>',
        f'<text x="4" y="14" class="ct">{escape(lr.label)}: tokens per expert (rows) per '
        f"layer over time (0-{times[-1]:.1f} s); darker = more than an even share</text>",
    ]
    for li, layer in enumerate(layers):
        y0 = TOP + li * (experts + 1) * CELL
        parts.append(f'<text x="4" y="{y0 + experts * CELL / 2 + 4}">layer {escape(layer)}</text>')
        for t, col in enumerate(grids[layer]):
            total = sum(col)
            for e, x in enumerate(col):
                rel = x * len(col) / total if total else 0.0
                shade = int(255 - min(1.0, rel / 3) * 235)
                parts.append(
                    f'<rect x="{LEFT + t * CELL}" y="{y0 + e * CELL}" width="{CELL}" '
                    f'height="{CELL}" fill="rgb({shade},{shade},255)"/>'
                )
    parts.append("</svg>")
    return "".join(parts)


def expert_section(runs: list[LoadedRun]) -> str:
    """The report's "Expert load" section (empty when no run has per-expert samples)."""
    maps = [m for m in (heatmap(lr) for lr in runs) if m]
    if not maps:
        return ""
    rows = []
    for lr in runs:
        exp = ((lr.meta.get("summary") or {}).get("telemetry") or {}).get("experts") or {}
        for layer, d in (exp.get("layers") or {}).items():
            if "max_over_mean" in d:
                rows.append(
                    f"<tr><td>{escape(lr.label)}</td><td>{escape(layer)}</td>"
                    f"<td>{d['total_tokens']:,.0f}</td><td>{d['max_over_mean']:.2f}</td>"
                    f"<td>{d['cv']:.2f}</td></tr>"
                )
    table = (
        "<table><tr><th>run</th><th>layer</th><th>tokens routed</th>"
        "<th>max / mean per expert</th><th>CV</th></tr>" + "".join(rows) + "</table>"
        if rows
        else ""
    )
    return table + '<div class="grid">' + "".join(maps) + "</div>"


def expert_fields(meta: dict[str, Any]) -> dict[str, float | None]:
    exp = ((meta.get("summary") or {}).get("telemetry") or {}).get("experts") or {}
    return {"expert_load_max_over_mean": exp.get("max_over_mean")}
