"""`cbbench serve` as a subprocess through the launcher: readiness, SIGTERM with a stream in
flight (it ends with an error event, the process exits 0), and start-up errors."""

from __future__ import annotations

import json
import signal
import threading

import httpx
import pytest
from cbbench.harness.errors import CbbenchError
from cbbench.harness.servers.launcher import launch_reference_server, start_reference_server


def test_sigterm_ends_in_flight_streams_and_exits_cleanly():
    # A static batch of 4 with a long drain timeout: the request waits in the queue, so its
    # stream is still open when the signal arrives.
    extra = ["--batch-size", "4", "--drain-timeout", "600", "--max-model-len", "64"]
    with launch_reference_server(scheduler="static", extra_args=extra) as server:
        assert server.base_url.startswith("http://127.0.0.1:")
        health = httpx.get(server.base_url + "/health", timeout=10)
        assert health.status_code == 200
        assert health.headers["x-cbbench-scheduler"] == "static"
        events: list[str] = []
        opened = threading.Event()

        def stream() -> None:
            body = {"prompt": "wait", "max_tokens": 4, "stream": True}
            with httpx.stream(
                "POST", server.base_url + "/v1/completions", json=body, timeout=60
            ) as r:
                opened.set()
                events.extend(ln for ln in r.iter_lines() if ln.startswith("data: "))

        t = threading.Thread(target=stream)
        t.start()
        assert opened.wait(30)
        server.process.send_signal(signal.SIGTERM)
        t.join(30)
        assert not t.is_alive()
        assert server.process.wait(30) == 0
        assert len(events) == 2, events
        error = json.loads(events[0][6:])["error"]
        assert error["code"] == "shutting_down" and "shutting down" in error["message"]
        assert events[1] == "data: [DONE]"
        assert "cbbench serve: stopped" in server.log_tail
        assert "Traceback" not in server.log_tail


@pytest.mark.slow  # same shutdown path as SIGTERM; a second server start costs ~10 s
def test_sigint_stops_an_idle_server():
    handle = start_reference_server(extra_args=["--max-model-len", "64"])
    try:
        r = httpx.post(
            handle.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=30
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        handle.process.send_signal(signal.SIGINT)
        assert handle.process.wait(30) == 0
    finally:
        handle.stop()


def test_launcher_reports_a_server_that_cannot_start():
    with pytest.raises(CbbenchError, match="exited with code 2.*no-such-model"):
        start_reference_server(model="no-such-model", ready_timeout_s=60)
