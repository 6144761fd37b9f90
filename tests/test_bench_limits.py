"""Limits a run must state rather than hit (issue 51 #4, #12): connections are opened only for
requests that can be in flight (`--concurrency 100000 --num-requests 5` opens 5), running out
of file descriptors is one line and a run marked failed (never "complete" with 0 records),
`--duration 0s` is refused, and `--num-requests` beyond a trace's length says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cbbench.harness.cli import main
from servers.fake import Behavior, FakeServerConfig, threaded

FAST = FakeServerConfig(Behavior(ttft_s=0.001, itl_s=0.001))
QUIET = ["--no-live", "--no-server-metrics", "--no-gpu-metrics", "--workload", "seed-demo"]


def test_a_huge_concurrency_opens_only_the_connections_it_can_use(tmp_path, capsys) -> None:
    out = tmp_path / "r"
    with threaded(FAST) as srv:
        argv = ["bench", "--base-url", srv.url, "--out", str(out), *QUIET]
        assert main([*argv, "--concurrency", "100000", "--num-requests", "5"]) == 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["summary"]["connections"]["opened"] == 5, meta["summary"]["connections"]
    assert meta["load"]["concurrency"] == 100000 and meta["load"]["max_in_flight"] == 5
    assert meta["status"] == "complete" and meta["summary"]["counts"]["completed"] == 5


LOW_FD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (60, 60))
from cbbench.harness.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_out_of_file_descriptors_is_one_line_and_a_failed_run(tmp_path) -> None:
    out = tmp_path / "r"
    with threaded(FAST) as srv:
        argv = ["bench", "--base-url", srv.url, "--out", str(out), *QUIET]
        argv += ["--concurrency", "200", "--num-requests", "200"]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
        proc = subprocess.run(
            [sys.executable, "-c", LOW_FD, *argv], capture_output=True, text=True, timeout=120,
            env=env,
        )  # fmt: skip
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if "error" in x]
    assert len(lines) == 1 and "ulimit -n is 60" in lines[0], proc.stderr
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "failed" and "file descriptors" in meta["error"]


def test_zero_duration_is_refused(tmp_path, capsys) -> None:
    argv = ["bench", "--base-url", "http://127.0.0.1:9", "--out", str(tmp_path / "r"), *QUIET]
    assert main([*argv, "--duration", "0s"]) == 2
    err = capsys.readouterr().err
    assert "--duration must be longer than 0" in err and "Traceback" not in err


def test_more_requests_than_the_trace_holds_says_so(tmp_path, capsys) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [{"timestamp": 100 * i, "input_length": 8, "output_length": 4} for i in range(10)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "r"
    with threaded(FAST) as srv:
        argv = ["bench", "--base-url", srv.url, "--out", str(out), "--no-live"]
        argv += ["--no-server-metrics", "--no-gpu-metrics", "--workload", str(trace)]
        assert main([*argv, "--num-requests", "100"]) == 0
    err = capsys.readouterr().err
    assert "--num-requests 100, but" in err and "holds 10 requests: sending 10" in err, err
    assert json.loads((out / "run.json").read_text())["load"]["num_requests_asked"] == 100
