"""The HTML report's summary fits 1,400 px on the bundled engine too (issue 42, finding 13):
with server metrics a run has ten more columns (KV usage, GPU, KV dtype and blocks, capacity,
running, preemptions) and the one summary table scrolled sideways; the server's columns are a
second table now. Checked in headless chromium at 1,400 px, as a user sees it."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile

from cbbench.harness.cli import main
from cbbench.harness.servers.launcher import launch_reference_server

from tests.diagnose_support import hardware_file, sim_args
from tests.test_report_browser import chromium

WIDTH = 1400
CHECK = """<script>
window.addEventListener('load',()=>{const fit=id=>{const t=document.getElementById(id);if(!t)return null;
const b=t.parentElement;return {right:t.getBoundingClientRect().right,scroll:b.scrollWidth,
client:b.clientWidth,heads:[...t.rows[0].cells].map(c=>c.innerText)};};
document.body.setAttribute('data-check',JSON.stringify({inner:window.innerWidth,
run:fit('summary'),server:fit('summary-server')}));});
</script>"""


def test_summary_with_server_columns_fits_1400_px(tmp_path) -> None:
    hw = hardware_file(tmp_path, c0=0.001, c_seq=0.0)
    with launch_reference_server("tiny", "continuous", "cpu", sim_args(hw)) as srv:
        for name in ("a", "b"):
            argv = ["bench", "--base-url", srv.base_url, "--num-requests", "12",
                    "--concurrency", "4", "--metrics-interval", "0.05", "--no-live",
                    "--no-gpu-metrics", "--out", str(tmp_path / name)]  # fmt: skip
            assert main(argv) == 0
    html = tmp_path / "r.html"
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(html)]) == 0
    probe = tmp_path / "probe.html"
    probe.write_text(html.read_text().replace("<head>", "<head>" + CHECK, 1))
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--user-data-dir={profile}", f"--window-size={WIDTH},2000", "--dump-dom",
             probe.as_uri()],
            capture_output=True, text=True, timeout=90,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r'data-check="([^"]*)"', proc.stdout)
    assert m, "the page did not finish loading"
    c = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert c["inner"] == WIDTH and c["server"] is not None, c
    assert "KV blocks" in c["server"]["heads"] and "TTFT p99 (ms)" in c["run"]["heads"], c
    for table in ("run", "server"):  # neither scrolls sideways
        t = c[table]
        assert t["scroll"] <= t["client"] and t["right"] <= c["inner"], (table, c)
