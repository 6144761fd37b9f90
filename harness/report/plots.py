"""The report's charts, built from runs; every series is downsampled to a fixed budget."""

from __future__ import annotations

import numpy as np
from cbbench.harness.conclusions.window import in_flight, steady_window
from cbbench.harness.report.runs import LoadedRun, load_level
from cbbench.harness.report.samples import RunSamples
from cbbench.harness.report.svg import PALETTE, Series, chart, color, downsample_minmax

CDF_POINTS = 200  # quantiles per CDF curve
TIMELINE_POINTS = 600  # per run and metric
SCATTER_POINTS = 2000  # over all runs

CDF_METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E latency"))
CURVE_METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E latency"))
TTFO = ("ttfo", "TTFO (first answer token)")  # beside TTFT when a run reasoned


def _metrics(base: tuple, samples: list[RunSamples]) -> tuple:
    """`base`, with TTFO after TTFT when any run reasoned (else TTFO is TTFT)."""
    if not any(s.reasoning_tokens for s in samples):
        return base
    return (base[0], TTFO, *base[1:])


TIMELINES = (
    ("running", "running requests", "requests", 1.0),
    ("waiting", "waiting requests", "requests", 1.0),
    ("kv_usage", "KV cache usage", "% of blocks", 100.0),
    ("util_gpu", "GPU utilization", "%", 1.0),
)


def cdf_charts(runs: list[LoadedRun], samples: list[RunSamples]) -> list[str]:
    out = []
    q = np.linspace(0.0, 1.0, CDF_POINTS)
    for metric, title in _metrics(CDF_METRICS, samples):
        series = []
        for i, (lr, s) in enumerate(zip(runs, samples, strict=True)):
            v = s.latency(metric)
            v = v[~np.isnan(v)]
            if v.size:
                xs = np.quantile(v, q) * 1e3 if v.size > CDF_POINTS else np.sort(v) * 1e3
                ys = q if v.size > CDF_POINTS else np.arange(1, v.size + 1) / v.size
                series.append(Series(lr.label, list(xs), list(ys), color(i), mode="step"))
        out.append(chart(f"CDF of {title}", series, f"{title} (ms)", "fraction of requests"))
    return out


def curve_charts(runs: list[LoadedRun], samples: list[RunSamples], rows: list[dict]) -> list[str]:
    """Latency vs achieved throughput: a line per load sweep, a point per other run."""
    groups: dict[str, list[int]] = {}
    for i, lr in enumerate(runs):
        groups.setdefault(lr.sweep if lr.in_sweep and lr.sweep else lr.label, []).append(i)
    out = []
    for metric, title in _metrics(CURVE_METRICS, samples):
        series = []
        for name, idx in groups.items():
            idx = sorted(idx, key=lambda i: rows[i]["output_throughput"] or 0.0)
            xs = [rows[i]["output_throughput"] for i in idx]
            for stat, dash in (("p50", False), ("p99", True)):
                ys = [
                    None
                    if rows[i][f"{metric}.{stat}"] is None
                    else rows[i][f"{metric}.{stat}"] * 1e3
                    for i in idx
                ]
                keep = [k for k in range(len(idx)) if xs[k] is not None and ys[k] is not None]
                px, py = [xs[k] for k in keep], [ys[k] for k in keep]
                tips = [
                    f"{runs[idx[k]].label} ({load_level(runs[idx[k]].meta) or 'load ?'}): "
                    f"{stat} {py[j]:.1f} ms at {px[j]:.1f} tok/s"
                    for j, k in enumerate(keep)
                ]
                # p50: the colour of the group's first run in every chart; p99 a hue of its
                # own (half the palette away), so the two never read as one line
                c = color(min(idx) + (len(PALETTE) // 2 if stat == "p99" else 0))
                if len(idx) > 1:
                    series.append(Series(f"{name} {stat}", px, py, c, dash=dash))
                series.append(
                    Series(
                        f"{name} {stat}", px, py, c, "markers", labels=tips, legend=len(idx) == 1
                    )
                )
        out.append(
            chart(
                f"{title} vs throughput",
                series,
                "output tokens/s",
                f"{title} p50 / p99 (ms)",
                x_from_zero=True,
            )
        )
    return out


def timeline_charts(runs: list[LoadedRun], samples: list[RunSamples]) -> list[str]:
    out = []
    for key, title, unit, scale in TIMELINES:
        series = []
        for i, lr in enumerate(runs):
            pts = [
                (float(x["t_s"]), float(x[key]) * scale)
                for x in lr.run.timeseries
                if isinstance(x.get(key), (int, float)) and isinstance(x.get("t_s"), (int, float))
            ]
            if pts:
                pts.sort()
                xs, ys = downsample_minmax(
                    np.array([p[0] for p in pts]), np.array([p[1] for p in pts]), TIMELINE_POINTS
                )
                series.append(Series(lr.label, xs, ys, color(i)))
        if series:
            y_range = (0.0, 100.0) if unit.startswith("%") else None
            out.append(chart(title, series, "time since start (s)", unit, y_range=y_range))
    series = []
    for i, (lr, s) in enumerate(zip(runs, samples, strict=True)):
        t = np.sort(s.finish_s[~np.isnan(s.finish_s)])
        if t.size:
            n = np.arange(1, t.size + 1, dtype=np.float64)
            xs, ys = downsample_minmax(t, n, TIMELINE_POINTS)
            series.append(Series(lr.label, xs, ys, color(i), mode="step"))
    out.append(chart("completed requests", series, "time since start (s)", "requests done"))
    out.append(in_flight_chart(runs))
    return out


def in_flight_chart(runs: list[LoadedRun]) -> str:
    """Requests in flight over time, each run's steady-state window shaded (the rule:
    harness/conclusions/window.py)."""
    series, bands = [], []
    for i, lr in enumerate(runs):
        recs = [r for r in lr.run.records if not r.warmup and r.sent_s is not None and r.end_s]
        if not recs:
            continue
        t = np.unique(np.r_[[r.sent_s for r in recs], [r.end_s for r in recs]])
        n = in_flight(recs, t)
        xs, ys = downsample_minmax(t, n, TIMELINE_POINTS)
        series.append(Series(lr.label, xs, ys, color(i), mode="step"))
        w = steady_window(lr.run.records)
        if w is not None:
            bands.append((w.start_s, w.end_s, color(i), f"{lr.label}: {w.label()}"))
    title = "requests in flight (shaded: steady window)"
    return chart(title, series, "time since start (s)", "in flight", bands=bands)


def scatter_chart(runs: list[LoadedRun], samples: list[RunSamples]) -> str:
    rng = np.random.default_rng(0)
    per_run = max(1, SCATTER_POINTS // max(1, len(runs)))
    series = []
    for i, (lr, s) in enumerate(zip(runs, samples, strict=True)):
        keep = np.flatnonzero(~np.isnan(s.ttft))
        if keep.size > per_run:
            keep = np.sort(rng.choice(keep, per_run, replace=False))
        xs, ys = s.prompt_len[keep], s.ttft[keep] * 1e3
        tips = [
            f"{lr.label}: prompt {x:.0f} tok, TTFT {y:.1f} ms" for x, y in zip(xs, ys, strict=True)
        ]
        series.append(Series(lr.label, list(xs), list(ys), color(i), "markers", labels=tips))
    return chart("prompt length vs TTFT", series, "prompt tokens", "TTFT (ms)")


def session_charts(runs: list[LoadedRun]) -> list[str]:
    """Multi-turn runs: TTFT by turn (p50 solid, p90 dashed) and prefix-cache hits by turn
    (an agent graph's calls by their step, their depth in the graph + 1); empty when no run
    has sessions."""
    ttft, hits = [], []
    for i, lr in enumerate(runs):
        by_turn: dict[int, list] = {}
        for r in lr.run.records:
            if r.session_id is not None and r.ok and not r.warmup:
                g = r.extra.get("graph")  # an agent graph's call: its step (depth + 1)
                step = int(g.get("depth") or 0) + 1 if isinstance(g, dict) else r.turn or 1
                by_turn.setdefault(step, []).append(r)
        if not by_turn:
            continue
        turns = sorted(by_turn)
        for q, dash in ((50, False), (90, True)):
            xs, ys = [], []
            for t in turns:
                v = [r.ttft_s for r in by_turn[t] if r.ttft_s is not None]
                if v:
                    xs.append(float(t))
                    ys.append(float(np.percentile(v, q)) * 1e3)
            tips = [
                f"{lr.label}: turn {x:.0f}, TTFT p{q} {y:.1f} ms"
                for x, y in zip(xs, ys, strict=True)
            ]
            c = color(i + (len(PALETTE) // 2 if q == 90 else 0))  # p90: a hue of its own
            ttft.append(Series(f"{lr.label} p{q}", xs, ys, c, dash=dash))
            ttft.append(Series(f"{lr.label} p{q}", xs, ys, c, "markers", dash, tips, legend=False))
        xs, ys = [], []
        for t in turns:
            pairs = [
                (r.extra["num_cached_tokens"], r.prompt_tokens_server)
                for r in by_turn[t]
                if isinstance(r.extra.get("num_cached_tokens"), (int, float))
                and r.prompt_tokens_server
            ]
            if pairs:
                xs.append(float(t))
                ys.append(100.0 * sum(c for c, _ in pairs) / sum(p for _, p in pairs))
        if xs:
            hits.append(Series(lr.label, xs, ys, color(i)))
    if not ttft:
        return []
    out = [chart("TTFT by turn", ttft, "turn of the session", "TTFT p50 / p90 (ms)")]
    if hits:
        out.append(
            chart(
                "prefix-cache hits by turn",
                hits,
                "turn of the session",
                "% of prompt tokens cached",
                y_range=(0.0, 100.0),
            )
        )
    return out


def goodput_chart(runs: list[LoadedRun]) -> str:
    """Goodput (share of requests meeting every SLO) against the offered request rate: one
    line per sweep through the median run at each rate (a capacity search's repeats show as
    extra points). Empty without SLOs."""
    groups: dict[str, list[tuple[float, float, str]]] = {}
    for lr in runs:
        rate = (lr.meta.get("load") or {}).get("rate")
        good = ((lr.meta.get("summary") or {}).get("goodput") or {}).get("fraction")
        if not isinstance(rate, (int, float)) or not isinstance(good, (int, float)):
            continue
        if not np.isfinite(rate):
            continue
        key = lr.sweep if lr.in_sweep and lr.sweep else lr.label
        groups.setdefault(key, []).append((float(rate), float(good), lr.label))
    if sum(len(v) for v in groups.values()) < 2:
        return ""
    series = []
    for i, (name, pts) in enumerate(groups.items()):
        pts.sort()
        at: dict[float, list[float]] = {}
        for r, g, _ in pts:
            at.setdefault(r, []).append(g)
        # the line: the median run per rate (the capacity search's majority rule: 2 of 3
        # runs meet the SLO iff the median does), not the best, which hid misses
        xs = sorted(at)
        ys = [float(np.median(at[x])) * 100 for x in xs]
        series.append(Series(name, xs, ys, color(i), legend=False))
        tips = [f"{label}: {g:.0%} at {r:g} req/s" for r, g, label in pts]
        series.append(
            Series(
                name,
                [p[0] for p in pts],
                [p[1] * 100 for p in pts],
                color(i),
                "markers",
                labels=tips,
            )
        )
    return chart(
        "Goodput vs offered rate",
        series,
        "offered requests/s",
        "requests meeting SLO (%)",
        y_range=(0.0, 100.0),
        x_from_zero=True,
    )
