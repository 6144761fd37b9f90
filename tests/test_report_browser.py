"""The HTML report in headless Chromium: no console errors, charts rendered, screenshot not blank,
and crafted strings in result files cannot run script."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from cbbench.harness.cli import main
from PIL import Image
from report_synth import write_run

CRAFTED = '</script><script>alert("x")</script><img src=x onerror=alert(1)>'
WIDTH, HEIGHT = 1400, 3200

# Injected into a *copy* of the report: records script errors and alert() calls, and after
# load writes what was rendered into a data attribute that --dump-dom shows.
SENTINEL = """<script>
window.__errs=[];window.addEventListener('error',e=>window.__errs.push(String(e.message)));
window.alert=m=>window.__errs.push('alert:'+m);
window.addEventListener('load',()=>{const c=[...document.querySelectorAll('svg.chart')];
const vis=c.filter(s=>{const r=s.getBoundingClientRect();return r.width>200&&r.height>150;});
document.body.setAttribute('data-check',JSON.stringify({errs:window.__errs,charts:c.length,
visible:vis.length,lines:document.querySelectorAll('svg.chart polyline').length,
dots:document.querySelectorAll('svg.chart circle').length,scripts:document.scripts.length,
imgs:document.images.length,best:document.querySelectorAll('td.best').length,
sim:document.querySelectorAll('.sim').length}));});
</script>"""


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        # a missing browser is a failed check, never a silent skip (.ci/run installs it)
        pytest.fail("chromium is not installed (apt-get install -y chromium)")
    return exe


def render(html_path: Path, out_png: Path) -> tuple[dict, str]:
    """Open a sentinel-instrumented copy; return (checks, console lines)."""
    probe = html_path.with_name("probe.html")
    probe.write_text(
        html_path.read_text(encoding="utf-8").replace("<head>", "<head>" + SENTINEL, 1),
        encoding="utf-8",
    )
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [
                chromium(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                "--enable-logging=stderr",
                "--v=0",
                f"--window-size={WIDTH},{HEIGHT}",
                f"--screenshot={out_png}",
                "--dump-dom",
                probe.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=90,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r"data-check=\"([^\"]*)\"", proc.stdout)
    assert m, "the page did not finish loading (no data-check attribute)"
    checks = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    console = "\n".join(line for line in proc.stderr.splitlines() if ":CONSOLE" in line)
    return checks, console


def screenshot_stats(png: Path) -> tuple[tuple[int, int], float, int]:
    """(size, fraction of non-white pixels, pixels in the first series colour #4e79a7)."""
    img = Image.open(png).convert("RGB")
    px = np.asarray(img, dtype=np.int16)
    non_white = float(np.mean(np.any(px != 255, axis=2)))
    series0 = int(np.sum(np.all(np.abs(px - (0x4E, 0x79, 0xA7)) < 12, axis=2)))
    return img.size, non_white, series0


def test_one_run_renders_without_console_errors(tmp_path: Path) -> None:
    run = write_run(tmp_path / "only", n=150, seed=1)
    html = tmp_path / "one.html"
    assert main(["report", str(run), "--out", str(html)]) == 0
    checks, console = render(html, tmp_path / "one.png")
    assert console == ""
    assert checks["errs"] == []
    # 3 CDFs + 4 timelines + in-flight + completions + scatter; no throughput curves for one run
    assert checks["charts"] == checks["visible"] == 10  # + the in-flight timeline with the steady window
    assert checks["lines"] >= 8 and checks["dots"] >= 100
    assert checks["best"] == 0  # nothing to compare against
    size, non_white, series0 = screenshot_stats(tmp_path / "one.png")
    assert size == (WIDTH, HEIGHT)
    assert non_white > 0.04  # tables, axes and curves drawn
    assert series0 > 500  # the run's colour is on screen: plots were painted


def test_six_runs_render_and_crafted_text_stays_text(tmp_path: Path) -> None:
    runs = [
        write_run(tmp_path / f"run{i}", n=150, seed=i, ttft_scale=1 + 0.15 * i, rate=2**i)
        for i in range(5)
    ]
    runs.append(
        write_run(
            tmp_path / "evil",
            n=150,
            seed=9,
            errors=3,
            model=CRAFTED,
            error_message=CRAFTED,
            meta={"name": CRAFTED, "simulated": True},
        )
    )
    html = tmp_path / "six.html"
    assert main(["report", *map(str, runs), "-o", str(html)]) == 0
    text = html.read_text(encoding="utf-8")
    checks, console = render(html, tmp_path / "six.png")
    assert console == ""
    assert checks["errs"] == []  # no alert() ran, no script error
    assert checks["scripts"] == 2  # the sentinel and the report's JSON data block only
    assert checks["imgs"] == 0
    assert checks["charts"] == checks["visible"] == 13  # + 3 latency-vs-throughput curves, the in-flight timeline
    assert checks["best"] >= 10 and checks["sim"] >= 2
    size, non_white, series0 = screenshot_stats(tmp_path / "six.png")
    assert size == (WIDTH, HEIGHT) and non_white > 0.06 and series0 > 500
    # the crafted name is in the page as text, and intact in the embedded JSON
    assert "&lt;/script&gt;&lt;script&gt;alert(&quot;x&quot;)" in text
    data = re.search(
        r'<script type="application/json" id="cbbench-data">(.*?)</script>', text, re.S
    )
    assert data and "</" not in data.group(1)
    names = [r["name"] for r in json.loads(data.group(1))["runs"]]  # labels: the folders
    assert CRAFTED in names
