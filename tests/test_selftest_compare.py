"""`cbbench selftest --compare locust`: Locust (one body, then cbbench's per-request prompts)
and cbbench run against the same local server; the table gives each one's requests per
client CPU-second and the ratios."""

import re
import subprocess
import sys

NAMES = (
    "locust FastHttpUser, one body",
    "locust FastHttpUser, cbbench's prompts",
    "cbbench (raw client)",
)


def test_compare_locust_prints_every_client_and_the_ratios():
    cmd = [sys.executable, "-m", "cbbench.harness.cli", "selftest", "--compare", "locust"]
    cmd += ["--streams", "2", "--tokens", "4", "--seconds", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    rows = {}
    for name in NAMES:
        line = next(ln for ln in out.splitlines() if name in ln)
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        rows[name] = (int(cells[1]), int(cells[2]), float(cells[-1]))
    for requests, failed, per_cpu_s in rows.values():
        assert requests > 0 and failed == 0 and per_cpu_s > 0
    text = " ".join(out.split())
    ratios = [float(x) for x in re.findall(r"([0-9.]+)x \(Locust", text)]
    ours = rows[NAMES[2]][2]
    for ratio, base in zip(ratios, NAMES[:2], strict=True):
        expect = ours / rows[base][2]
        assert abs(ratio - expect) <= 0.01 * expect + 0.01
