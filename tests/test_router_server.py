"""The router in front of real reference servers (in-process, 127.0.0.1, ephemeral ports),
driven with the official openai client: routing, streaming, /metrics, /health, API key,
disconnects, and replicas that refuse or drop connections."""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.router.serve import RouterOptions, RouterThread

from tests.server_support import scrape, serve, wait_for_metric

TINY = EngineConfig(model="tiny", enable_prefix_caching=True)


def closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connections are refused
    return f"http://127.0.0.1:{port}"


def served_requests(url: str) -> float:
    return scrape(url).get("vllm:e2e_request_latency_seconds_count", 0.0)


@pytest.fixture(scope="module")
def two_replicas() -> Iterator[tuple[str, str]]:
    with serve(TINY) as (u1, _), serve(TINY) as (u2, _):
        yield u1, u2


def test_every_request_lands_on_exactly_one_replica(two_replicas):
    u1, u2 = two_replicas
    before = [served_requests(u) for u in (u1, u2)]
    opts = RouterOptions([u1, u2], policy="least-outstanding", port=0, poll_interval_s=0.2)
    with RouterThread(opts) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        done = []

        def one(k: int) -> None:
            if k % 2:
                r = client.completions.create(model="tiny", prompt=f"req {k}", max_tokens=8)
                assert r.usage.completion_tokens == 8
            else:
                s = client.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "user", "content": f"req {k}"}],
                    max_tokens=8,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                chunks = list(s)
                assert chunks[-1].usage.completion_tokens == 8
            done.append(k)

        threads = [threading.Thread(target=one, args=(k,)) for k in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(done) == list(range(16))
        raw = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert raw.headers["x-cbbench-replica"] in ("r0", "r1")
        assert raw.headers["x-cbbench-scheduler"] == "router:least-outstanding"
        served = [served_requests(u) - b for u, b in zip((u1, u2), before, strict=True)]
        assert sum(served) == 17  # each request once, on one replica
        assert min(served) >= 1  # both replicas served under load
        time.sleep(0.5)  # a poll after the last request
        m = scrape(url)
        routed = [m[f"cbbench:router_requests_routed_total{{replica=r{i}}}"] for i in (0, 1)]
        assert routed == served
        for name in (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "cbbench:router_prefix_cache_hit_rate",
            "cbbench:router_requests_in_flight",
        ):
            assert f"{name}{{replica=r0}}" in m and f"{name}{{replica=r1}}" in m, name
        assert m["vllm:prefix_cache_queries_total{replica=r0}"] > 0
        assert m["cbbench:router_routing_time_seconds_count{policy=least-outstanding}"] == 17
        assert httpx.get(url + "/health").json()["status"] == "ok"


def test_bad_input_gets_openai_errors(two_replicas):
    with RouterThread(RouterOptions(list(two_replicas), port=0)) as url:
        r = httpx.post(url + "/v1/completions", content=b"{not json")
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
        r = httpx.post(url + "/v1/completions", json={"prompt": "x", "model": "nope"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 10**6})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_api_key_checked_and_forwarded():
    with serve(TINY, api_key="k1") as (u1, _):
        with RouterThread(RouterOptions([u1], port=0, api_key="k1")) as url:
            r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            assert httpx.get(url + "/health").status_code == 200  # open, as on the replicas
            client = openai.OpenAI(base_url=url + "/v1", api_key="k1", max_retries=0)
            assert client.completions.create(model="tiny", prompt="x", max_tokens=2).usage
        # the router's own key differs from the replicas'
        opts = RouterOptions([u1], port=0, api_key="front", replica_api_key="k1")
        with RouterThread(opts) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="front", max_retries=0)
            assert client.completions.create(model="tiny", prompt="x", max_tokens=2).usage


def test_refused_replica_leaves_rotation_and_health_says_degraded(two_replicas):
    dead = closed_port_url()
    opts = RouterOptions([dead, two_replicas[0]], policy="round-robin", port=0)
    with RouterThread(opts) as url:
        health = httpx.get(url + "/health").json()
        assert health["status"] == "degraded"
        assert health["replicas"][0]["healthy"] is False
        assert "poll failed" in health["replicas"][0]["error"]
        for _ in range(4):
            r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert r.status_code == 200 and r.headers["x-cbbench-replica"] == "r1"


def test_no_replica_reachable_is_one_error():
    opts = RouterOptions([closed_port_url()], port=0)
    with pytest.raises(EngineError, match="no replica is reachable"), RouterThread(opts):
        pass


class DroppingHandler(http.server.BaseHTTPRequestHandler):
    """A replica that looks healthy but breaks every generation: a stream gets its head and
    one event, then the connection closes; a plain request gets no answer at all."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        body = b"vllm:num_requests_running 0\n" if self.path == "/metrics" else b"{}"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers["content-length"]))
        if b'"stream": true' in raw or b'"stream":true' in raw:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            event = b'data: {"choices":[{"index":0,"text":"a"}]}\n\n'
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
        self.close_connection = True  # gone, without finishing the answer


@contextlib.contextmanager
def dropping_replica() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), DroppingHandler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_replica_lost_mid_request_fails_with_an_openai_body():
    with dropping_replica() as bad:
        with RouterThread(RouterOptions([bad], port=0, poll_interval_s=30)) as url:
            r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert r.status_code == 502
            err = r.json()["error"]
            assert err["code"] == "replica_failed" and "replica r0" in err["message"]
            health = httpx.get(url + "/health")
            assert health.status_code == 503 and health.json()["error"]["code"] == "no_replica"
            r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert r.status_code == 503 and r.json()["error"]["code"] == "no_replica"
        with RouterThread(RouterOptions([bad], port=0, poll_interval_s=30)) as url:
            with httpx.stream(
                "POST", url + "/v1/completions", json={"prompt": "x", "stream": True}
            ) as s:
                assert s.status_code == 200
                events = [ln for ln in s.iter_lines() if ln.startswith("data: ")]
            assert events[0].startswith('data: {"choices"')
            assert '"code": "replica_failed"' in events[1] and events[-1] == "data: [DONE]"
            assert scrape(url)["cbbench:router_request_failures_total{replica=r0}"] == 1


def test_client_disconnect_aborts_the_request_at_the_replica():
    with serve(TINY) as (u1, _), RouterThread(RouterOptions([u1], port=0)) as url:
        body = {"prompt": "x", "max_tokens": 1500, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body) as s:
            for line in s.iter_lines():
                if line.startswith("data: "):
                    break  # one token seen: hang up
        assert wait_for_metric(u1, "vllm:num_requests_running", 0.0) == 0.0
        assert scrape(u1)["vllm:generation_tokens_total"] < 1500
        # the non-streaming path: a client timeout closes the connection
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/completions", json={**body, "stream": False}, timeout=0.5)
        assert wait_for_metric(u1, "vllm:num_requests_running", 0.0) == 0.0
        assert scrape(u1)["vllm:generation_tokens_total"] < 3000
        deadline = time.monotonic() + 5
        while httpx.get(url + "/health").json()["replicas"][0]["in_flight"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
