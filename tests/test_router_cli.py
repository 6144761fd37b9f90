"""`cbbench route` and `cbbench sim --replicas` from the command line: the ready line, a
request through it, and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
from cbbench.harness.servers.launcher import launch_server
from cbbench.reference_engine.config.engine_config import EngineConfig

from tests.server_support import serve

CLI = [sys.executable, "-m", "cbbench.harness.cli"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


def test_route_serves_and_names_its_replicas():
    with serve(EngineConfig(model="tiny")) as (replica, _):
        cmd = [*CLI, "route", "--replica", replica, "--replica", "http://127.0.0.1:1",
               "--policy", "round-robin", "--port", "0"]  # fmt: skip
        with launch_server(cmd, ready_timeout_s=60, name="cbbench route") as h:
            r = httpx.post(h.base_url + "/v1/completions", json={"prompt": "x", "max_tokens": 3})
            assert r.status_code == 200 and r.headers["x-cbbench-replica"] == "r0"
            assert httpx.get(h.base_url + "/health").json()["status"] == "degraded"
        log = h.log_tail
    assert "cbbench route: ready at http://127.0.0.1:" in log
    assert "r1 http://127.0.0.1:1 OUT of rotation" in log


def test_route_errors_are_one_line():
    p = cli("route", "--replica", "localhost:8000", "--port", "0")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "--replica 'localhost:8000': expected a base URL like http://HOST:PORT" in p.stderr
    p = cli("route", "--replica", "http://127.0.0.1:1", "--port", "0")
    assert p.returncode == 2 and "no replica is reachable" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    p = cli("route", "--replica", "http://127.0.0.1:1", "--poll-interval", "0")
    assert p.returncode == 2 and "--poll-interval must be > 0" in p.stderr


def test_sim_replicas_table_and_errors(tmp_path):
    p = cli("sim", "--replicas", "3", "--router", "round-robin,least-outstanding",
            "--workload", "chat", "--num-requests", "30", "--out", str(tmp_path))  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "SIMULATED: 3 x llama-3-8b" in p.stdout and "requests/replica CV" in p.stdout
    doc = json.loads((tmp_path / "cluster.json").read_text())
    assert doc["round-robin"]["requests_per_replica"]["max_over_mean"] == 1.0
    assert doc["least-outstanding"]["num_requests"] == 30
    p = cli("sim", "--replicas", "2", "--router", "random")
    assert p.returncode == 2 and "--router: unknown policy random" in p.stderr
    p = cli("sim", "--replicas", "0")
    assert p.returncode == 2 and "--replicas must be >= 1" in p.stderr
    p = cli("serve", "--model", "tiny", "--replicas", "0", "--port", "0")
    assert p.returncode == 2 and "--replicas must be in [1, 64]" in p.stderr
