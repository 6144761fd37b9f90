"""Issue 51: `gate` on two embeddings runs judges the rules that apply (E2E latency, errors)
and says which do not (token rates, TTFT, TPOT), exit 0; it exited 2 on "output throughput
0". Real runs of `cbbench bench --endpoint embeddings` against a test server on loopback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.process_support import readline_within

SERVER = Path(__file__).with_name("api_server.py")
CLI = [sys.executable, "-m", "cbbench.harness.cli"]


def test_gate_on_embeddings_runs_skips_what_does_not_apply(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--api", "embeddings"], stdout=subprocess.PIPE, text=True
    )
    try:
        line = readline_within(proc, 60, "the test server")
        url = f"http://127.0.0.1:{int(line.split()[1])}"
        for name in ("base", "cand"):
            subprocess.run(
                [*CLI, "bench", "--base-url", url, "--endpoint", "embeddings", "--workload",
                 "chat", "--num-requests", "24", "--concurrency", "2", "--no-live",
                 "--no-extensions", "--no-server-metrics", "--no-gpu-metrics",
                 "--out", str(tmp_path / name)],
                check=True, capture_output=True, timeout=120,
            )  # fmt: skip
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
    gate = subprocess.run(
        [*CLI, "gate", "--baseline", str(tmp_path / "base"), "--candidate", str(tmp_path / "cand"),
         ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert gate.returncode in (0, 1), gate.stderr
    # piped: Markdown, a rule a line, never wrapped mid-phrase
    assert (
        "| output tokens/s must not fall > 5% | – | – | – | – | >= -5% | n/a (does not apply: "
        "no tokens generated (embeddings)) |" in gate.stdout.splitlines()
    ), gate.stdout
    assert "not applicable" in gate.stdout.splitlines()[-1]
    assert "error rate" in gate.stdout and "(0 of 24 requests failed)" in gate.stdout
