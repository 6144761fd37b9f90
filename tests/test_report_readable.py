"""The HTML report reads well at 1,400 px (issue 42, finding 13): runs are named after their
folders, the summary table fits without sideways scrolling, each finding's five-engine fix
table is collapsed (charts are not pushed screens down), a column has one number format, and
p50 and p99 are drawn in different colours. Checked in headless chromium, as a user sees it."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from pathlib import Path

import pytest
from cbbench.harness.cli import main
from cbbench.harness.report.svg import PALETTE
from cbbench.harness.report.table import fmt_column
from servers.fake import Behavior, FakeServerConfig, threaded

from tests.test_report_browser import chromium

WIDTH = 1400
CHECK = """<script>
window.addEventListener('load',()=>{const s=document.querySelector('#summary');
const box=s.parentElement;const f=[...document.querySelectorAll('.finding')];
const rows=[...s.querySelectorAll('tr')].slice(1).map(r=>[...r.cells].map(c=>c.innerText));
document.body.setAttribute('data-check',JSON.stringify({
 inner:window.innerWidth,right:s.getBoundingClientRect().right,
 scroll:box.scrollWidth,client:box.clientWidth,findings:f.length,
 closed:document.querySelectorAll('.finding details:not([open])').length,
 tallest:Math.max(...f.map(x=>x.getBoundingClientRect().height)),rows:rows,
 config:(()=>{const t=document.querySelector('#config');return {right:t.getBoundingClientRect()
 .right,scroll:t.parentElement.scrollWidth,client:t.parentElement.clientWidth};})(),
 star:document.querySelectorAll('td.best').length,
 note:[...document.querySelectorAll('p.muted')].map(p=>p.innerText).join(' ')}));});
</script>"""


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("readable")
    rules = {i: Behavior(status=429) for i in range(0, 40, 7)}  # a finding with fixes
    ok = Behavior(ttft_s=0.03, itl_s=0.002, tokens_per_chunk=1)
    with threaded(FakeServerConfig(default=ok, rules=rules)) as srv:
        # output tok/s about 150 and 4,000: one column holds numbers both sides of 1,000
        for name, wl in (("baseline-run", "seed-demo"), ("tuned-run", "mixed")):
            argv = ["bench", "--base-url", srv.url, "--workload", wl, "--num-requests",
                    "30", "--rate", "20", "--out", str(root / name), "--no-live",
                    "--no-server-metrics", "--no-gpu-metrics"]  # fmt: skip
            assert main(argv) == 3  # exit 3: finished, some requests failed (the 429s)
    html = root / "r.html"
    assert (
        main(["report", str(root / "baseline-run"), str(root / "tuned-run"), "--out", str(html)]) == 0
    )
    probe = root / "probe.html"
    probe.write_text(html.read_text().replace("<head>", "<head>" + CHECK, 1))
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--user-data-dir={profile}", f"--window-size={WIDTH},2000",
             f"--screenshot={root / 'r.png'}", "--dump-dom", probe.as_uri()],
            capture_output=True, text=True, timeout=90,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r'data-check="([^"]*)"', proc.stdout)
    assert m, "the page did not finish loading"
    return html, json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def test_runs_are_named_after_their_folders(report) -> None:
    html, checks = report
    assert [r[0] for r in checks["rows"]] == ["baseline-run", "tuned-run"]
    assert "mixed #2" not in html.read_text()


def test_summary_table_fits_1400_px(report) -> None:
    _, c = report
    assert c["inner"] == WIDTH
    assert c["scroll"] <= c["client"] and c["right"] <= c["inner"], c


def test_configuration_table_fits_1400_px(report) -> None:
    """Issue 51: the configuration table (the command line, the workload spec as JSON)
    overflowed 1,400 px; long values now wrap inside their cell."""
    _, c = report
    assert c["config"]["scroll"] <= c["config"]["client"], c["config"]
    assert c["config"]["right"] <= c["inner"], c["config"]


def test_footnote_says_the_slo_or_why_goodput_is_empty(report) -> None:
    """Neither run had an SLO: the footnote names the runs whose goodput it cannot fill, and
    claims no star for a tie (error rates and such equal across both runs)."""
    _, c = report
    assert "goodput needs an SLO (--slo) for" not in c["note"]  # neither had one: said once
    assert "Goodput needs an SLO (--slo)." in c["note"]
    assert "none for a tie or a difference below the printed precision" in c["note"]


def test_fix_tables_are_collapsed(report) -> None:
    _, c = report
    assert c["findings"] == 2 and c["closed"] == 2  # one per run, each collapsed
    assert c["tallest"] < 260  # a finding is a few lines, not a five-row table


def test_one_number_format_per_column(report) -> None:
    _, c = report
    for col in zip(*c["rows"], strict=True):
        decimals = {len(m.group(1)) for v in col[:] if (m := re.search(r"\.(\d+)", v))}
        assert len(decimals) <= 1, col  # never "2,047" beside "370.45"
    tok_s = [float(r[3].split()[0].replace(",", "")) for r in c["rows"]]  # output tok/s
    assert min(tok_s) < 1000 <= max(tok_s), tok_s  # the case the issue saw
    assert fmt_column([2047.3, 370.46]) == ["2,047.3", "370.5"]


def test_p50_and_p99_have_different_colours(report) -> None:
    html, _ = report
    text = html.read_text()
    chart = text[text.index("TTFT vs throughput") :]
    chart = chart[: chart.index("</svg>")]
    assert PALETTE[0] in chart and PALETTE[len(PALETTE) // 2] in chart  # run 1: p50, p99
