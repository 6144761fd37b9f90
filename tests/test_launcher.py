"""The one launcher and its one readiness signal: every server cbbench starts prints
`NAME: ready at URL`, and launch_server waits for that line."""

from __future__ import annotations

import sys

import httpx
import pytest
from cbbench.harness.errors import CbbenchError
from cbbench.harness.servers.launcher import (
    READY_PREFIX,
    fake_server_command,
    launch_server,
    parse_ready_line,
    ready_line,
)


def test_ready_line_round_trips():
    url = "http://127.0.0.1:4321"
    assert parse_ready_line(ready_line("cbbench serve", url) + "\n") == url
    assert ready_line("cbbench serve", url) == READY_PREFIX + url
    assert parse_ready_line("INFO: Uvicorn running on http://127.0.0.1:1") is None
    assert parse_ready_line("PORT 4321") is None


def test_fake_server_starts_through_the_launcher_and_answers():
    with launch_server(fake_server_command(procs=2)) as server:
        assert server.base_url.startswith("http://127.0.0.1:")
        r = httpx.get(server.base_url + "/v1/models", timeout=10, trust_env=False)
        assert r.status_code == 200
    assert server.process.poll() is not None  # stopped on leaving the block


def test_a_child_that_dies_before_ready_is_one_clear_error():
    cmd = [sys.executable, "-c", "import sys; print('boom: no model'); sys.exit(3)"]
    with (
        pytest.raises(CbbenchError, match=r"exited with code 3 before it was ready: boom"),
        launch_server(cmd, name="test server"),
    ):
        pass
