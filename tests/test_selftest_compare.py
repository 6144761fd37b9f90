"""`cbbench selftest --compare locust`: both clients run against the same local server and
the table gives each one's requests per client CPU-second and the ratio."""

import re
import subprocess
import sys


def test_compare_locust_prints_both_clients_and_the_ratio():
    cmd = [sys.executable, "-m", "cbbench.harness.cli", "selftest", "--compare", "locust"]
    cmd += ["--streams", "2", "--tokens", "4", "--seconds", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    rows = {}
    for name in ("locust FastHttpUser", "cbbench (raw client)"):
        line = next(ln for ln in out.splitlines() if name in ln)
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        rows[name] = (int(cells[1]), int(cells[2]), float(cells[-1]))
    for requests, failed, per_cpu_s in rows.values():
        assert requests > 0 and failed == 0 and per_cpu_s > 0
    ratio = float(re.search(r"CPU-second: ([0-9.]+)x", out).group(1))
    expect = rows["cbbench (raw client)"][2] / rows["locust FastHttpUser"][2]
    assert abs(ratio - expect) <= 0.01 * expect + 0.01
