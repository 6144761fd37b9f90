"""The router's circuit breaker and retry: the breaker's state machine on a fake clock, what
counts as a failed answer, and `cbbench route` (a real child process) over two healthy fake
servers and one that misbehaves in turn (junk, 500 HTML, dropped mid-stream, headers then
nothing), driven by the official openai client: 60 requests per case, round-robin, 6 in
flight."""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from cbbench.harness.servers.fake_server import Behavior, FakeServerConfig, ThreadedServer
from cbbench.harness.servers.launcher import launch_server
from cbbench.reference_engine.router.breaker import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    BreakerSettings,
    CircuitBreaker,
)
from cbbench.reference_engine.router.upstream import junk_reason

from tests.server_support import scrape

CLI = [sys.executable, "-m", "cbbench.harness.cli"]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_breaker_opens_on_a_streak_and_a_probe_brings_it_back():
    clock = Clock()
    b = CircuitBreaker(BreakerSettings(failures=3, error_rate=0, cooldown_s=5), clock)
    assert not b.failure("500") and not b.failure("500")
    assert b.success() is False and b.streak == 0  # a good answer breaks the streak
    assert not b.failure("500") and not b.failure("500")
    assert b.failure("500") and b.state == OPEN and not b.allows
    assert "3 failures in a row (last: 500)" in (b.reason or "")
    assert not b.failure("late") and not b.success()  # answers in flight when it opened
    assert b.state == OPEN and not b.probe_due()
    clock.t = 5.0
    assert b.probe_due() and b.state == HALF_OPEN and not b.probe_due()
    assert b.failure("probe failed") and b.state == OPEN  # reopened, cool-down doubled
    clock.t = 14.9
    assert not b.probe_due()
    clock.t = 15.0
    assert b.probe_due()
    assert b.success() and b.state == CLOSED and b.allows and b.opened == 2


def test_breaker_opens_on_an_error_rate_and_at_once_on_a_hard_failure():
    b = CircuitBreaker(BreakerSettings(failures=0, error_rate=0.5, window=10), Clock())
    for _ in range(5):
        assert not b.success()
    for _ in range(4):
        assert not b.failure("junk")  # 4 of 9
    assert b.failure("junk") and b.state == OPEN
    assert b.reason == "5 of the last 10 failed (last: junk)"
    b = CircuitBreaker(BreakerSettings(failures=0, error_rate=0.5, window=4), Clock())
    assert not b.failure("junk")  # 1 of 1: the window is not half full yet
    b = CircuitBreaker(BreakerSettings(failures=5), Clock())
    assert b.failure("connection lost", hard=True) and b.state == OPEN


def test_what_counts_as_a_failed_answer():
    assert junk_reason(200, "application/json", b'{"choices": []}', False) is None
    assert junk_reason(400, "application/json", b"bad request", False) is None  # the client's
    assert "not JSON" in (junk_reason(200, "text/plain", b"<<junk>>", False) or "")
    assert "answered 500: <html>" in (junk_reason(500, "text/html", b"<html>x", False) or "")
    assert junk_reason(200, "text/event-stream", b'data: {"a": 1}\n\n', True) is None
    assert junk_reason(200, "text/event-stream", b": keep-alive\n\n", True) is None
    assert "not SSE" in (junk_reason(200, "text/event-stream", b"garbage", True) or "")
    # a stream request answered with a whole body is judged as one
    assert "not JSON" in (junk_reason(200, "application/json", b"junk", True) or "")


MODES = ("good", "junk", "500", "mid-stream", "hang")
HTML_500 = b"<html><body><h1>500 Internal Server Error</h1></body></html>"
EVENT = b'data: {"id":"b","object":"text_completion","model":"fake-model",' \
    b'"choices":[{"index":0,"text":" tok","finish_reason":null}]}\n\n'  # fmt: skip


class BadReplica(http.server.ThreadingHTTPServer):
    """A replica whose /health is always "ok" and whose answers follow `mode`."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), BadHandler)
        self.mode = "good"
        self.seen: Counter[str] = Counter()  # client requests (not probes) per mode
        self.release = threading.Event()  # ends the hangs


class BadHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: BadReplica

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, ctype: str, body: bytes, length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body) if length is None else length))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(200, "application/json", b'{"data": [{"id": "fake-model"}]}')
        else:
            self._send(200, "application/json", b"{}" if self.path == "/health" else b"")

    def do_POST(self) -> None:
        req = json.loads(self.rfile.read(int(self.headers["content-length"])))
        stream, mode = bool(req.get("stream")), self.server.mode
        if req.get("prompt") != "ping":
            self.server.seen[mode] += 1
        if mode == "junk":
            ctype = "text/event-stream" if stream else "application/json"
            return self._send(200, ctype, b"<<<not an answer>>>")
        if mode == "500":
            return self._send(500, "text/html", HTML_500)
        if mode == "hang" or (mode == "mid-stream" and not stream):
            if stream:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
            else:  # the head, then part of the body (mid-stream) or nothing (hang)
                self._send(200, "application/json", b'{"id": ' if mode != "hang" else b"", 500)
            if mode == "hang":
                self.server.release.wait(20)
            self.close_connection = True
            return
        if not stream:
            body = {"id": "b", "object": "text_completion", "model": "fake-model",
                    "choices": [{"index": 0, "text": " tok", "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}  # fmt: skip
            return self._send(200, "application/json", json.dumps(body).encode())
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        self._chunk(EVENT)
        self._chunk(EVENT)
        if mode == "mid-stream":  # two chunks, then the connection closes
            self.close_connection = True
            return
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")


@contextlib.contextmanager
def bad_replica() -> Iterator[BadReplica]:
    server = BadReplica()
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()


def one_request(client: openai.OpenAI, k: int) -> str | None:
    """None when it succeeded, else the error."""
    try:
        if k % 2:
            r = client.completions.create(model="fake-model", prompt=f"r{k}", max_tokens=4)
            assert r.choices[0].text
        else:
            s = client.completions.create(
                model="fake-model", prompt=f"r{k}", max_tokens=4, stream=True
            )
            assert "".join(c.choices[0].text for c in s if c.choices)
    except (openai.APIError, AssertionError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def replica_health(url: str, name: str) -> dict:
    reps = httpx.get(url + "/health", timeout=10).json()["replicas"]
    return next(r for r in reps if r["name"] == name)


def wait_until_back(url: str, name: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not replica_health(url, name)["healthy"]:
        assert time.monotonic() < deadline, f"{name} did not return: {replica_health(url, name)}"
        time.sleep(0.1)


def test_route_survives_a_replica_that_answers_badly():
    healthy = FakeServerConfig(default=Behavior(ttft_s=0.01, itl_s=0.005))
    a, b = ThreadedServer(healthy), ThreadedServer(healthy)
    try:
        with bad_replica() as bad:
            bad_url = f"http://127.0.0.1:{bad.server_address[1]}"
            cmd = [*CLI, "route", "--replica", a.url, "--replica", b.url, "--replica", bad_url,
                   "--policy", "round-robin", "--port", "0", "--poll-interval", "0.2",
                   "--upstream-timeout", "2", "--breaker-cooldown", "0.5"]  # fmt: skip
            with launch_server(cmd, ready_timeout_s=60, name="cbbench route") as h:
                client = openai.OpenAI(base_url=h.base_url + "/v1", api_key="x", max_retries=0)
                failures: dict[str, list[str]] = {}
                for mode in MODES[1:]:
                    opened = scrape(h.base_url)["cbbench:router_breaker_opened_total{replica=r2}"]
                    bad.mode = mode
                    with ThreadPoolExecutor(6) as pool:
                        errors = [e for e in pool.map(lambda k: one_request(client, k), range(60))]
                    failures[mode] = [e for e in errors if e is not None]
                    m = scrape(h.base_url)
                    assert m["cbbench:router_breaker_opened_total{replica=r2}"] > opened, mode
                    # out of rotation within the first few failures: few requests reached it
                    assert bad.seen[mode] <= 8, (mode, bad.seen)
                    assert replica_health(h.base_url, "r2")["healthy"] is False, mode
                    assert "circuit" in replica_health(h.base_url, "r2")["error"], mode
                    bad.release.set()  # the hangs end; the replica recovers
                    bad.mode = "good"
                    wait_until_back(h.base_url, "r2")
                    bad.release.clear()
                    before = bad.seen["good"]
                    with ThreadPoolExecutor(6) as pool:
                        assert not [
                            e for e in pool.map(lambda k: one_request(client, k), range(9)) if e
                        ]
                    assert bad.seen["good"] > before, f"{mode}: r2 is back but got no request"
                m = scrape(h.base_url)
                assert m["cbbench:router_requests_retried_total{replica=r2}"] >= 4
                assert m["cbbench:router_requests_retried_total{replica=r0}"] == 0
                r = httpx.post(h.base_url + "/v1/completions", json={"prompt": "x"})
                assert r.status_code == 200 and "x-cbbench-retried-from" not in r.headers
            log = h.log_tail
    finally:
        a.stop()
        b.stop()
    # junk, 500s and hangs fail before any byte reaches the client: all retried
    assert failures["junk"] == [] and failures["500"] == [] and failures["hang"] == []
    assert len(failures["mid-stream"]) <= 2, failures["mid-stream"]  # those in flight
    assert len(re.findall(r"router: r2 \(\S+\) out of rotation: circuit open", log)) >= 4, log
    assert len(re.findall(r"router: r2 \(\S+\) back in rotation", log)) >= 4, log


def bench_records(url: str, out) -> list:
    import io

    from cbbench.harness.load.runner import BenchConfig, run_bench
    from cbbench.harness.results.run_folder import load_run
    from cbbench.workloads.spec import RequestSpec, Workload
    from rich.console import Console

    wl = Workload(name="retry", seed=0, requests=tuple(RequestSpec(i, 4, 2) for i in range(6)))
    cfg = BenchConfig(base_url=url, workload=wl, concurrency=1, out_dir=str(out), live=False)
    run_bench(cfg, [], console=Console(file=io.StringIO()))
    return sorted(load_run(out).records, key=lambda r: r.index)


def test_retry_header_and_the_failure_when_no_replica_is_left(tmp_path):
    ok = ThreadedServer(FakeServerConfig(default=Behavior()))
    try:
        with bad_replica() as bad:
            bad.mode = "500"
            bad_url = f"http://127.0.0.1:{bad.server_address[1]}"
            cmd = [*CLI, "route", "--replica", bad_url, "--replica", ok.url,
                   "--policy", "round-robin", "--port", "0"]  # fmt: skip
            with launch_server(cmd, ready_timeout_s=60, name="cbbench route") as h:
                r = httpx.post(h.base_url + "/v1/completions", json={"prompt": "x"})
                assert r.status_code == 200, r.text
                assert r.headers["x-cbbench-replica"] == "r1"
                assert r.headers["x-cbbench-retried-from"] == "r0"
                recs = bench_records(h.base_url, tmp_path / "run")  # the harness records both
                assert [r.extra.get("replica") for r in recs] == ["r1"] * 6
                assert [r.extra.get("retried_from") for r in recs].count("r0") == 2  # then open
            alone = [*CLI, "route", "--replica", bad_url, "--port", "0"]
            with launch_server(alone, ready_timeout_s=60, name="cbbench route") as h:
                r = httpx.post(h.base_url + "/v1/completions", json={"prompt": "x"})
                assert r.status_code == 500 and r.headers["x-cbbench-replica"] == "r0"
                err = r.json()["error"]
                assert err["code"] == "replica_failed" and "answered 500: <html>" in err["message"]
    finally:
        ok.stop()


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--breaker-error-rate", "2", "--breaker-error-rate must be in [0, 1], got 2.0"),
        ("--breaker-cooldown", "0", "--breaker-cooldown must be > 0 s, got 0.0"),
        ("--breaker-window", "0", "--breaker-window must be >= 1, got 0"),
        ("--retries", "2", "argument --retries: invalid choice: 2"),
    ],
)
def test_breaker_flags_are_checked(flag, value, message):
    p = subprocess.run(
        [*CLI, "route", "--replica", "http://127.0.0.1:1", flag, value],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_least_outstanding_does_not_pour_requests_into_a_fast_junk_replica():
    """A replica that answers junk at once looks the least loaded: without the breaker,
    least-outstanding would send it the most requests."""
    from cbbench.reference_engine.router.serve import RouterOptions, RouterThread

    healthy = FakeServerConfig(default=Behavior(ttft_s=0.02, itl_s=0.005))
    a, b = ThreadedServer(healthy), ThreadedServer(healthy)
    try:
        with bad_replica() as bad:
            bad.mode = "junk"
            bad_url = f"http://127.0.0.1:{bad.server_address[1]}"
            opts = RouterOptions([bad_url, a.url, b.url], policy="least-outstanding", port=0)
            with RouterThread(opts) as url:
                client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
                with ThreadPoolExecutor(6) as pool:
                    errors = [e for e in pool.map(lambda k: one_request(client, k), range(60)) if e]
                health = replica_health(url, "r0")
    finally:
        a.stop()
        b.stop()
    assert errors == []
    assert bad.seen["junk"] <= 8, bad.seen
    assert health["healthy"] is False and health["breaker"] == "open"
