"""The engine in its own process: the IPC codec carries any output dataclass field; a real
server (API process + engine process) answers the official client, aborts on disconnect,
answers 503 (never hangs) once the engine process dies, and `cbbench serve` stops on
SIGTERM with a stream in flight."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field

import httpx
import openai
import pytest
from cbbench.harness.servers.launcher import launch_reference_server
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.core import outputs as outputs_module
from cbbench.reference_engine.core.outputs import EngineStats, RequestMetrics, RequestOutput
from cbbench.reference_engine.sampling_params import SamplingParams
from cbbench.reference_engine.server.ipc import decode, encode, msgpack_decode, msgpack_encode

from tests.server_support import scrape, serve, wait_for_metric

CODECS = [(encode, decode), (msgpack_encode, msgpack_decode)]


@pytest.mark.parametrize("encode, decode", CODECS, ids=["pickle", "msgpack"])
def test_ipc_round_trips_outputs_with_every_field(encode, decode):
    out = RequestOutput("r1", [5, 7], 3, 2, True, "stop", RequestMetrics(1.5, 1.6, 1.7, 2.0, 1, 16))
    stats = EngineStats(1, 2, 3, 4, 5, 6, 0.5, 7, 0.01)
    params = SamplingParams(max_tokens=4, temperature=0.0, stop_token_ids=(3, 4))
    back = decode(encode({"outputs": [out], "stats": stats, "params": params}))
    assert back["outputs"] == [out]
    assert back["stats"] == stats and back["stats"].kv_usage == pytest.approx(0.8)
    assert list(back["params"].stop_token_ids) == [3, 4] and back["params"].greedy


@pytest.mark.parametrize("encode, decode", CODECS, ids=["pickle", "msgpack"])
def test_ipc_carries_fields_it_has_never_heard_of(monkeypatch, encode, decode):
    # What another feature adds to an output (draft counts, logprobs by token id) flows
    # through unchanged: the codec reads the dataclass's own fields.
    @dataclass
    class OutputV2(RequestOutput):
        num_draft_tokens: int = 0
        logprobs: list[dict[int, float]] = field(default_factory=list)

    OutputV2.__module__ = outputs_module.__name__
    OutputV2.__qualname__ = "OutputV2"
    monkeypatch.setattr(outputs_module, "OutputV2", OutputV2, raising=False)
    out = OutputV2("r", [1], 1, 1, False, None, RequestMetrics(0.0), 4, [{1: -0.5, 9: -2.0}])
    back = decode(encode([out]))[0]
    assert type(back) is OutputV2 and back == out


def test_msgpack_codec_refuses_to_rebuild_foreign_classes():
    @dataclass
    class Foreign:
        x: int = 1

    with pytest.raises(ValueError, match="not a cbbench class"):
        msgpack_decode(msgpack_encode(Foreign()))


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def proc_server():
    # 96 tokens of KV; async scheduling on: the engine process pipelines its steps
    config = EngineConfig(max_model_len=128, num_kv_blocks=6, async_scheduling=True)
    with serve(config, engine_process=True) as (url, stack):
        yield url, stack


def test_engine_process_serves_the_openai_client(proc_server):
    url, stack = proc_server
    assert stack.engine.process.is_alive() and stack.engine_info["engine_process"] is True
    c = _client(url)
    r = c.completions.create(
        model="tiny", prompt=[5, 6, 7], max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.usage.completion_tokens == 6 and r.choices[0].finish_reason == "length"
    chunks = list(
        c.completions.create(
            model="tiny", prompt="hello", max_tokens=4, stream=True, extra_body={"ignore_eos": True}
        )
    )
    assert chunks[-1].choices[0].finish_reason == "length"
    samples = scrape(url)
    assert samples["vllm:generation_tokens_total"] >= 10
    assert samples["vllm:num_requests_running"] == 0
    # the step timings crossed the process boundary with the stats
    assert samples["cbbench:scheduler_time_seconds_count"] >= 10
    gaps = samples["cbbench:engine_step_gap_seconds_count"]
    assert 1 <= gaps < samples["cbbench:scheduler_time_seconds_count"]


def test_engine_process_rejections_keep_their_status(proc_server):
    url, _ = proc_server
    # Fits the context (128) but not the KV pool (96 tokens): only the engine knows, so its
    # EngineError crosses the process boundary and becomes a 400.
    r = httpx.post(url + "/v1/completions", json={"prompt": [1] * 100, "max_tokens": 5})
    assert r.status_code == 400, r.text
    assert "KV blocks" in r.json()["error"]["message"]


def test_client_disconnect_aborts_in_the_engine_process(proc_server):
    url, _ = proc_server
    body = {"prompt": "x", "max_tokens": 80, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # one token seen: the request runs in the engine process
    assert wait_for_metric(url, "vllm:num_requests_running", 0) == 0


def test_a_dead_engine_process_means_503_never_a_hang():
    with serve(EngineConfig(max_model_len=128), engine_process=True) as (url, stack):
        events: list[str] = []
        opened = threading.Event()

        def stream() -> None:
            body = {"prompt": "x", "max_tokens": 120, "stream": True, "ignore_eos": True}
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line)
                        opened.set()

        t = threading.Thread(target=stream)
        t.start()
        assert opened.wait(30)
        stack.engine.process.kill()
        t.join(30)
        assert not t.is_alive()
        error = json.loads(events[-2][6:])["error"]
        assert error["type"] == "server_error" and "engine failed" in error["message"]
        assert events[-1] == "data: [DONE]"
        health = httpx.get(url + "/health", timeout=10)
        assert health.status_code == 503 and health.json()["error"]["type"] == "server_error"
        r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10)
        assert r.status_code == 503
        assert "exited with code" in r.json()["error"]["message"]


def test_serve_subprocess_stops_on_sigterm_with_requests_in_flight():
    with launch_reference_server(extra_args=["--max-model-len", "256"]) as server:
        assert "engine in its own process" in server.log_tail
        opened = threading.Barrier(3)
        ends: list[str] = []

        def stream() -> None:
            body = {"prompt": "go", "max_tokens": 250, "stream": True, "ignore_eos": True}
            with httpx.stream(
                "POST", server.base_url + "/v1/completions", json=body, timeout=60
            ) as r:
                lines = r.iter_lines()
                next(ln for ln in lines if ln.startswith("data: "))
                opened.wait(30)
                ends.extend(ln for ln in lines if ln.startswith("data: "))

        threads = [threading.Thread(target=stream) for _ in range(2)]
        for t in threads:
            t.start()
        opened.wait(30)
        start = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 0
        took = time.monotonic() - start
        for t in threads:
            t.join(30)
        assert all(not t.is_alive() for t in threads)
        assert ends.count("data: [DONE]") == 2
        assert "cbbench serve: stopped" in server.log_tail
        assert "Traceback" not in server.log_tail
        print(f"SIGTERM -> exit in {took:.2f} s")  # the 2 s target is checked by hand/docs


def test_engine_process_spins_briefly_unless_told_otherwise(proc_server):
    _, stack = proc_server
    pid = stack.engine.process.pid
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(line.split("=", 1) for line in f.read().decode().split("\0") if "=" in line)
    assert env.get("GOMP_SPINCOUNT") == "20000" and "OMP_WAIT_POLICY" not in env
    assert "GOMP_SPINCOUNT" not in os.environ  # the API process's own environment unchanged


def test_engine_nice_lowers_only_the_engine_process_priority():
    import os

    mine = os.getpriority(os.PRIO_PROCESS, 0)
    config = EngineConfig(max_model_len=128)
    with serve(config, engine_process=True, engine_nice=3) as (url, stack):
        engine_pid = stack.engine.process.pid
        assert os.getpriority(os.PRIO_PROCESS, engine_pid) == min(19, mine + 3)
        assert os.getpriority(os.PRIO_PROCESS, 0) == mine
        out = _client(url).completions.create(model="tiny", prompt="hi", max_tokens=3)
        assert out.usage.completion_tokens == 3
