"""`cbbench locust` started by a script's `&` (SIGINT ignored): `kill -INT` on it reaches
Locust, which stops and writes its run folder. Before, the web UI kept running: Locust, a
child, never heard of the signal, and `cbbench` itself ignored it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from cbbench.harness.servers.launcher import launch_reference_server
from process_support import Lines, kill


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server() -> str:
    with launch_reference_server(model="tiny", scheduler="continuous") as handle:
        yield handle.base_url


def test_kill_int_stops_a_background_web_ui(server, tmp_path):
    port, out = _free_port(), tmp_path / "run"
    cmd = [sys.executable, "-m", "cbbench.harness.cli", "locust", "--base-url", server,
           "--workload", "seed-demo", "--num-requests", "6", "--web-port", str(port),
           "--out", str(out), "--no-gpu-metrics"]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # kill() takes Locust, the child, with it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as `&` does
    )
    try:
        lines = Lines(proc, "cbbench locust")
        lines.until("web UI at", 60)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        os.kill(proc.pid, signal.SIGINT)
        lines.wait_exit(40)
        assert (out / "run.json").exists()
    finally:
        kill(proc)
