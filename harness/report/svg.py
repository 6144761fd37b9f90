"""Static inline SVG charts: line, step and marker series on linear axes.

Rendered in Python, so the report needs no JavaScript and no network, every text passes
through `html.escape`, and a chart costs a few KB. Callers downsample; `MAX_POINTS` guards.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

import numpy as np

PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
MAX_POINTS = 2000  # per series


@dataclass
class Series:
    name: str
    xs: Sequence[float]
    ys: Sequence[float]
    color: str
    mode: str = "line"  # "line" | "step" | "markers"
    dash: bool = False  # dashed line; hollow markers
    labels: Sequence[str] | None = None  # tooltip per point (markers only)
    legend: bool = True


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About n round tick values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    t = first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


def _tick_label(v: float) -> str:
    """A tick as people write it: 15,000 ms (not "1.5e+04"), 0.25; exponents only past a
    million or below 0.001."""
    if v == 0:
        return "0"
    if abs(v) >= 1e7 or abs(v) < 1e-3:
        return f"{v:.3g}"
    return f"{v:,.6g}" if abs(v) >= 1 else f"{v:.4g}"


def downsample_minmax(xs: np.ndarray, ys: np.ndarray, max_points: int) -> tuple[list, list]:
    """Keep each bucket's min and max so peaks of a long time series survive."""
    n = len(xs)
    if n <= max_points:
        return list(map(float, xs)), list(map(float, ys))
    buckets = np.array_split(np.arange(n), max_points // 2)
    keep: list[int] = []
    for b in buckets:
        if b.size:
            lo, hi = b[np.argmin(ys[b])], b[np.argmax(ys[b])]
            keep.extend(sorted({int(lo), int(hi)}))
    return [float(xs[i]) for i in keep], [float(ys[i]) for i in keep]


def chart(
    title: str,
    series: list[Series],
    x_label: str,
    y_label: str,
    width: int = 580,
    height: int = 320,
    y_range: tuple[float, float] | None = None,
    bands: list[tuple[float, float, str, str]] | None = None,
    x_from_zero: bool = False,
) -> str:
    """`bands`: (x from, x to, color, label) shaded behind the series (a steady window).
    `x_from_zero`: the x axis starts at 0 (a rate or throughput, where the data's own range
    drew two runs 7 % apart at the chart's two edges)."""
    pad_l, pad_r, pad_t = 64, 16, 30
    legended = [s for s in series if s.legend]
    legend_rows = math.ceil(len(legended) / 3)
    pad_b = 44 + 18 * legend_rows
    total_h = height + 18 * legend_rows
    pw, ph = width - pad_l - pad_r, total_h - pad_t - pad_b
    finite = [
        (float(x), float(y))
        for s in series
        for x, y in zip(s.xs, s.ys, strict=True)
        if math.isfinite(x) and math.isfinite(y)
    ]
    n_points = sum(len(s.xs) for s in series)
    assert all(len(s.xs) <= MAX_POINTS for s in series), "downsample before charting"
    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{total_h}"'
        f' viewBox="0 0 {width} {total_h}" role="img" data-series="{len(series)}"'
        f' data-points="{n_points}"><title>{escape(title)}</title>',
        f'<text x="{width / 2}" y="18" class="ct">{escape(title)}</text>',
    ]
    if not finite:
        parts.append(f'<text x="{width / 2}" y="{total_h / 2}" class="empty">no data</text></svg>')
        return "".join(parts)
    x0, x1 = min(p[0] for p in finite), max(p[0] for p in finite)
    y0, y1 = y_range or (min(0.0, min(p[1] for p in finite)), max(p[1] for p in finite))
    zero = x_from_zero and x0 >= 0
    if zero:
        x0 = 0.0
    if x1 <= x0:
        x0, x1 = (x0, x1 + 1.0) if zero else (x0 - 0.5, x1 + 0.5)
    if any(s.mode == "markers" for s in series):  # keep edge markers inside the frame
        pad = 0.03 * (x1 - x0)
        x0, x1 = (x0 if zero else x0 - pad), x1 + pad
    if y1 <= y0:
        y1 = y0 + 1.0
    xt, yt = nice_ticks(x0, x1), nice_ticks(y0, y1)
    x0, x1 = min(x0, xt[0]), max(x1, xt[-1])
    y0, y1 = min(y0, yt[0]), max(y1, yt[-1])

    def sx(x: float) -> float:
        return pad_l + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return pad_t + ph - (y - y0) / (y1 - y0) * ph

    parts.append(f'<g class="axes"><rect x="{pad_l}" y="{pad_t}" width="{pw}" height="{ph}"/>')
    for t in yt:
        y = sy(t)
        parts.append(f'<line x1="{pad_l}" x2="{pad_l + pw}" y1="{y:.1f}" y2="{y:.1f}"/>')
        parts.append(f'<text x="{pad_l - 6}" y="{y + 4:.1f}" class="yt">{_tick_label(t)}</text>')
    for t in xt:
        x = sx(t)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{pad_t}" y2="{pad_t + ph}"/>')
        parts.append(f'<text x="{x:.1f}" y="{pad_t + ph + 16}" class="xt">{_tick_label(t)}</text>')
    parts.append(
        f'<text x="{pad_l + pw / 2}" y="{pad_t + ph + 34}" class="xl">{escape(x_label)}</text>'
        f'<text transform="translate(14 {pad_t + ph / 2}) rotate(-90)" class="yl">'
        f"{escape(y_label)}</text></g>"
    )
    for a, b, band_color, label in bands or []:
        xa, xb = sx(max(a, x0)), sx(min(b, x1))
        parts.append(
            f'<rect class="window" x="{xa:.1f}" y="{pad_t}" width="{max(0.0, xb - xa):.1f}" '
            f'height="{ph}" fill="{band_color}" fill-opacity="0.12"><title>{escape(label)}'
            "</title></rect>"
        )
    for s in series:
        pts = [
            (sx(float(x)), sy(float(y)), i)
            for i, (x, y) in enumerate(zip(s.xs, s.ys, strict=True))
            if math.isfinite(x) and math.isfinite(y)
        ]
        name = escape(s.name)
        if s.mode == "markers":
            paint = f'fill="none" stroke="{s.color}"' if s.dash else f'fill="{s.color}"'
            parts.append(f'<g class="series" {paint}><title>{name}</title>')
            for x, y, i in pts:
                tip = f"<title>{escape(s.labels[i])}</title>" if s.labels else ""
                parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.6">{tip}</circle>')
            parts.append("</g>")
            continue
        coords: list[str] = []
        for j, (x, y, _) in enumerate(pts):
            if s.mode == "step" and j:
                coords.append(f"{x:.1f},{pts[j - 1][1]:.1f}")
            coords.append(f"{x:.1f},{y:.1f}")
        dash = ' stroke-dasharray="5 3"' if s.dash else ""
        parts.append(
            f'<polyline class="series" fill="none" stroke="{s.color}" stroke-width="1.8"{dash}'
            f' points="{" ".join(coords)}"><title>{name}</title></polyline>'
        )
    for k, s in enumerate(legended):
        lx = pad_l + (k % 3) * (pw / 3)
        ly = pad_t + ph + 52 + 18 * (k // 3)
        label = s.name if len(s.name) <= 28 else s.name[:27] + "…"
        parts.append(
            f'<rect x="{lx:.1f}" y="{ly - 9}" width="12" height="10" '
            + (f'fill="none" stroke="{s.color}"' if s.dash else f'fill="{s.color}"')
            + "/>"
            f'<text x="{lx + 16:.1f}" y="{ly}" class="lg">{escape(label)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
