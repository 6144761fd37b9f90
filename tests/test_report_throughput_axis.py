"""Latency-vs-throughput charts start their x axis at 0: two engines 7 % apart in tok/s were
drawn at the chart's two edges (the axis spanned only their own range, 2,713-2,914), which
read as a large throughput gap."""

from __future__ import annotations

import re
from pathlib import Path

from cbbench.harness.report import build_report
from cbbench.harness.report.svg import Series, chart
from report_synth import write_run


def _x_ticks(svg: str) -> list[float]:
    return [float(t.replace(",", "")) for t in re.findall(r'class="xt">([^<]+)<', svg)]


def test_throughput_axis_starts_at_zero(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", n=40, seed=1, rate=4.0)
    b = write_run(tmp_path / "b", n=40, seed=2, rate=4.4)
    html = build_report([a, b]).html()
    svg = html[html.index("<title>TTFT vs throughput") :]
    svg = svg[: svg.index("</svg>")]
    ticks = _x_ticks(svg)
    assert ticks[0] == 0.0, ticks


def test_default_axis_still_fits_the_data() -> None:
    s = [Series("r", [2713.0, 2914.0], [1.0, 2.0], "#000", "markers")]
    assert _x_ticks(chart("t", s, "x", "y"))[0] > 2000  # timelines, CDFs: the data's range
    ticks = _x_ticks(chart("t", s, "x", "y", x_from_zero=True))
    assert ticks[0] == 0.0 and ticks[-1] >= 2914
