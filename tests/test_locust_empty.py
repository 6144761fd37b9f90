"""A Locust web UI stopped before any test ran (issue 51 #12) wrote run.json "complete" with
0 records; now its status is "empty" and it says so, and `diagnose` calls the run partial."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from cbbench.harness.cli import main
from process_support import readline_within
from servers.fake import Behavior, FakeServerConfig, threaded


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_web_ui_stopped_before_any_test_is_empty_not_complete(tmp_path: Path, capsys) -> None:
    out, port = tmp_path / "run", _free_port()
    with threaded(FakeServerConfig(Behavior())) as srv:
        argv = [sys.executable, "-m", "cbbench.harness.cli", "locust", "--base-url", srv.url]
        argv += ["--workload", "seed-demo", "--num-requests", "4", "--out", str(out)]
        argv += ["--no-gpu-metrics", "--no-server-metrics", "--web-port", str(port)]
        log = tmp_path / "locust.log"
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True,  # noqa: SIM115
            start_new_session=True,
        )  # fmt: skip
        try:
            readline_within(proc, 120, "cbbench locust", log)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # the UI is up; nobody starts a test
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/cbbench", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
            os.killpg(proc.pid, signal.SIGINT)
            rest, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "empty", meta["status"]
    assert "no request finished" in rest, rest
    assert main(["diagnose", str(out)]) == 0
    assert "partial: the run holds no measured request" in capsys.readouterr().out
