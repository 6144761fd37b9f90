"""Per-replica charts and figures of runs behind a router: a timeline per field (load,
running, waiting, KV usage, requests routed), one line per replica and run, from the
`source: "replicas"` samples (telemetry/replicas.py), and the imbalance the summary gives.
"""

from __future__ import annotations

from html import escape
from typing import Any

import numpy as np
from cbbench.harness.report.runs import LoadedRun
from cbbench.harness.report.svg import Series, chart, color, downsample_minmax

TIMELINE_POINTS = 600
REPLICA_TIMELINES = (
    ("load", "replica load (running + waiting, else in flight)", "requests", 1.0),
    ("running", "replica running requests", "requests", 1.0),
    ("waiting", "replica waiting requests", "requests", 1.0),
    ("kv_usage", "replica KV cache usage", "% of blocks", 100.0),
    ("routed", "requests routed to each replica", "requests", 1.0),
)


def replica_series(lr: LoadedRun) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """replica -> field -> [(t_s, value)] of one run."""
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for s in lr.run.timeseries:
        reps, t = s.get("replicas"), s.get("t_s")
        if s.get("source") != "replicas" or not isinstance(reps, dict) or not _num(t):
            continue
        for name, fields in reps.items():
            for k, v in (fields or {}).items():
                if _num(v):
                    out.setdefault(str(name), {}).setdefault(k, []).append((float(t), float(v)))
    return out


def replica_charts(runs: list[LoadedRun]) -> list[str]:
    per_run = [replica_series(lr) for lr in runs]
    out = []
    for key, title, unit, scale in REPLICA_TIMELINES:
        series = []
        k = 0
        for lr, reps in zip(runs, per_run, strict=True):
            for name in sorted(reps):
                pts = sorted(reps[name].get(key) or [])
                if not pts:
                    continue
                if key == "routed":  # counted since the run started
                    pts = [(t, v - pts[0][1]) for t, v in pts]
                xs, ys = downsample_minmax(
                    np.array([p[0] for p in pts]), np.array([p[1] * scale for p in pts]),
                    TIMELINE_POINTS,
                )  # fmt: skip
                label = name if len(runs) == 1 else f"{lr.label} {name}"
                series.append(Series(label, xs, ys, color(k)))
                k += 1
        if series:
            y_range = (0.0, 100.0) if unit.startswith("%") else None
            out.append(chart(title, series, "time since start (s)", unit, y_range=y_range))
    return out


def imbalance_fields(meta: dict[str, Any]) -> dict[str, float | None]:
    """The summary's imbalance of time-averaged load across replicas (max/mean, CV)."""
    tel = (meta.get("summary") or {}).get("telemetry") or {}
    load = ((tel.get("replicas") or {}).get("imbalance") or {}).get("load") or {}
    return {
        "replica_load_max_over_mean": load.get("max_over_mean"),
        "replica_load_cv": load.get("cv"),
    }


def replica_section(runs: list[LoadedRun]) -> str:
    """The report's "Replicas" section (empty when no run has per-replica samples)."""
    charts = replica_charts(runs)
    if not charts:
        return ""
    rows = []
    for lr in runs:
        tel = (lr.meta.get("summary") or {}).get("telemetry") or {}
        rep = tel.get("replicas") or {}
        for name, d in sorted((rep.get("per_replica") or {}).items()):
            load = (d.get("load") or {}).get("mean")
            rows.append(
                f"<tr><td>{escape(lr.label)}</td><td>{escape(name)}</td>"
                f"<td>{'–' if load is None else f'{load:.2f}'}</td>"
                f"<td>{d.get('routed', '–') if d.get('routed') is None else int(d['routed'])}</td></tr>"
            )
        imb = rep.get("imbalance") or {}
        for what, x in imb.items():
            rows.append(
                f"<tr><td>{escape(lr.label)}</td><td colspan=3>imbalance of {escape(what)}: "
                f"max / mean {x['max_over_mean']:.2f}, CV {x['cv']:.2f}</td></tr>"
            )
    table = (
        "<table><tr><th>run</th><th>replica</th><th>load mean</th><th>routed</th></tr>"
        + "".join(rows)
        + "</table>"
    )
    return table + '<div class="grid">' + "".join(charts) + "</div>"


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
