"""The Responses, Messages and embeddings endpoints on the client's fast path, timed against an
independent server's log (`api_server.py`): 32 reasoning then 32 answer tokens, 10 ms apart,
the first at 50 ms. TTFT p50 and TTFO p50 within 1 ms of the server's, TPOT within 5 %, 32
reasoning and 64 output tokens on every record, reconciled with the API's usage. Embeddings:
latency within 1 ms of the server's, one vector per input. Then each API's error body, a
malformed stream, the non-streamed bodies, and `cbbench bench --endpoint ...`."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cbbench.harness.client import messages, responses
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.results.records import RequestRecord
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console

from tests.process_support import readline_within

N = 8
SERVER = Path(__file__).with_name("api_server.py")
CLI = [sys.executable, "-m", "cbbench.harness.cli"]


def _server(api: str, *extra: str):
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--api", api, *extra], stdout=subprocess.PIPE, text=True
    )
    line = readline_within(proc, 60, "the test server")
    assert line.startswith("PORT "), line
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


def _log(proc) -> dict[str, dict]:
    proc.terminate()
    out, _ = proc.communicate(timeout=20)
    return {e["id"]: e for e in map(json.loads, out.splitlines())}


def _bench(url: str, tmp_path: Path, endpoint: str, n: int = N, **kw):
    wl = Workload("api-test", 0, tuple(RequestSpec(i, 8, 64, None) for i in range(n)))
    cfg = BenchConfig(
        base_url=url,
        workload=wl,
        endpoint=endpoint,
        concurrency=2,
        out_dir=tmp_path / "run",
        live=False,
        extensions=False,
        **kw,
    )
    return run_bench(cfg, console=Console(file=io.StringIO()))


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_streams_timed_against_an_independent_servers_log(tmp_path, api):
    proc, url = _server(api)
    try:
        res = _bench(url, tmp_path, api)
    finally:
        log = _log(proc)
    recs = res.records
    assert len(recs) == N and all(r.ok for r in recs), [r.error for r in recs]
    for r in recs:
        assert r.reasoning_tokens == 32 and r.stream_flags == []
        assert r.output_tokens_client == 64 and r.output_tokens_server == 64
        assert r.prompt_tokens_server == 5 and r.finish_reason == "length"
        assert r.token_mismatch is None
    truth, ours = [], []
    for r in recs:
        e = log[r.id]
        s, recv = e["send_ns"], e["recv_ns"]
        assert len(s) == 64
        truth.append(((s[0] - recv) / 1e9, (s[32] - recv) / 1e9, (s[-1] - s[0]) / 63e9))
        ours.append((r.ttft_s, r.ttfo_s, r.tpot_s))
    p_ours, p_theirs = np.median(ours, axis=0), np.median(truth, axis=0)
    print(api, "p50 client", p_ours, "server log", p_theirs)
    assert p_theirs[0] == pytest.approx(0.05, abs=0.01)  # the server kept its schedule
    assert abs(p_ours[0] - p_theirs[0]) < 1e-3 and abs(p_ours[1] - p_theirs[1]) < 1e-3
    assert abs(p_ours[2] / p_theirs[2] - 1) < 0.05
    s = res.summary
    assert s["total_reasoning_tokens"] == 32 * N and s["ttfo_s"]["count"] == N


# serial: latency within 1 ms of the server's log
@pytest.mark.serial
def test_embeddings_latency_against_the_servers_log(tmp_path):
    proc, url = _server("embeddings")
    try:
        res = _bench(url, tmp_path, "embeddings", embeddings_batch=4)
    finally:
        log = _log(proc)
    recs = res.records
    assert len(recs) == N and all(r.ok for r in recs), [r.error for r in recs]
    for r in recs:
        assert r.extra["inputs"] == 4 and r.extra["dims"] == 16
        assert r.prompt_tokens_server == 4 * 8  # four token-id inputs of the prompt's 8
        assert r.ttft_s is None and r.output_tokens_client == 0
    ours = np.median([r.e2e_s for r in recs])
    theirs = np.median([(log[r.id]["send_ns"][0] - log[r.id]["recv_ns"]) / 1e9 for r in recs])
    print("embeddings p50 client", ours, "server", theirs)
    assert theirs == pytest.approx(0.05, abs=0.01) and abs(ours - theirs) < 1e-3
    assert res.summary["total_input_tokens"] == 4 * 8 * N


@pytest.mark.parametrize("api", ["responses", "messages", "embeddings"])
def test_each_apis_error_body_is_in_the_record(tmp_path, api):
    proc, url = _server(api)
    try:
        res = _bench(url, tmp_path, api, n=2, model="bad")
    finally:
        _log(proc)
    for r in res.records:
        assert r.error_kind == "http_4xx" and "model 'bad' does not exist" in r.error, r.error


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_a_malformed_stream_is_a_named_failure(tmp_path, api):
    proc, url = _server(api, "--malformed", "--reasoning", "2", "--answer", "4", "--gap-ms", "1")
    try:
        res = _bench(url, tmp_path, api, n=2)
    finally:
        _log(proc)
    for r in res.records:
        assert r.error_kind == "protocol" and "not a string" in r.error or "bad delta" in r.error


def _fold(adapter, events, state=None):
    """Chat chunks the adapter makes of `events` (None dropped)."""
    state = {} if state is None else state
    return [c for c in (adapter.event(e, state) for e in events) if c is not None], state


def test_responses_tool_call_and_failed_events():
    chunks, state = _fold(
        responses.ADAPTER,
        [
            {"type": "response.output_item.added", "item": {"type": "function_call"}},
            {"type": "response.function_call_arguments.delta", "delta": '{"a":'},
            {"type": "response.reasoning_summary_text.delta", "delta": "why"},
        ],
    )
    assert chunks[0]["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] == '{"a":'
    assert chunks[1]["choices"][0]["delta"] == {"reasoning": "why"}
    with pytest.raises(responses.RequestFailed, match="overloaded"):
        responses.event({"type": "response.failed",
                         "response": {"error": {"message": "overloaded"}}}, {})  # fmt: skip
    with pytest.raises(responses.RequestFailed, match="without a type"):
        responses.event({"delta": "x"}, {})


def test_messages_tool_use_usage_and_error_events():
    chunks, state = _fold(
        messages.ADAPTER,
        [
            {"type": "message_start", "message": {"usage": {"input_tokens": 7,
                                                            "output_tokens": 1}}},
            {"type": "content_block_delta", "delta": {"type": "input_json_delta",
                                                      "partial_json": '{"q"'}},
            {"type": "content_block_delta", "delta": {"type": "signature_delta",
                                                      "signature": "zz"}},
            {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
             "usage": {"output_tokens": 3}},
            {"type": "message_stop"},
        ],
    )  # fmt: skip
    assert chunks[0] == {"usage": {"prompt_tokens": 7}}
    assert chunks[1]["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] == '{"q"'
    assert chunks[2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[2]["usage"] == {"prompt_tokens": None, "completion_tokens": 3}
    assert state["done"]
    with pytest.raises(messages.RequestFailed, match="Overloaded"):
        messages.event({"type": "error", "error": {"type": "overloaded_error",
                                                   "message": "Overloaded"}}, {})  # fmt: skip
    with pytest.raises(messages.RequestFailed, match="bad delta"):
        messages.event({"type": "content_block_delta", "delta": {"type": "nope"}}, {})


def test_non_streamed_bodies_fold_as_chat():
    from cbbench.harness.client.response import Response, finish

    body = {"status": "completed", "output": [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]},
        {"type": "message", "content": [{"type": "output_text", "text": "hi there"}]}],
        "usage": {"input_tokens": 4, "output_tokens": 9,
                  "output_tokens_details": {"reasoning_tokens": 3}}}  # fmt: skip
    rec = RequestRecord("r", 0, 4, 9)
    resp = Response(rec, False, False, adapter=responses.ADAPTER)
    resp.head(200, lambda h: None)
    resp.sent(0)
    resp.data(json.dumps(body).encode(), 1_000_000)
    resp.end(2_000_000)
    finish(rec, resp, 0, 2_000_000)
    assert rec.ok and rec.output_tokens_server == 9 and rec.reasoning_tokens == 3
    assert rec.prompt_tokens_server == 4 and rec.finish_reason == "stop"
    msg = {"type": "message", "content": [{"type": "thinking", "thinking": "hm"},
           {"type": "text", "text": "hi"}], "stop_reason": "end_turn",
           "usage": {"input_tokens": 4, "output_tokens": 5}}  # fmt: skip
    rec = RequestRecord("m", 0, 4, 5)
    resp = Response(rec, False, False, adapter=messages.ADAPTER)
    resp.head(200, lambda h: None)
    resp.sent(0)
    resp.data(json.dumps(msg).encode(), 1_000_000)
    resp.end(2_000_000)
    finish(rec, resp, 0, 2_000_000)
    assert rec.ok and rec.output_tokens_server == 5 and rec.finish_reason == "stop"


@pytest.mark.parametrize("api", ["responses", "messages", "embeddings"])
def test_cbbench_bench_endpoint(tmp_path, api):
    proc, url = _server(api)
    try:
        out = subprocess.run(
            [*CLI, "bench", "--base-url", url, "--endpoint", api, "--workload", "seed-demo",
             "--num-requests", "3", "--no-extensions", "--out", str(tmp_path / "r"), "--no-live",
             "--embeddings-batch", "2", "--no-server-metrics", "--no-gpu-metrics"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        _log(proc)
    assert out.returncode == 0, out.stderr
    recs = [json.loads(x) for x in (tmp_path / "r" / "requests.jsonl").read_text().splitlines()]
    assert len(recs) == 3 and all(r["status"] == "ok" for r in recs), recs
    if api == "embeddings":
        assert all(r["extra"]["inputs"] == 2 and r["e2e_s"] > 0.04 for r in recs)
        assert "embeddings: 6 inputs" in out.stdout and "short outputs 0" in out.stdout
        assert "prompts differ in length" not in out.stdout  # the batch's tokens, both sides
    else:
        assert "TTFO (ms)" in out.stdout
        assert [r["reasoning_tokens"] for r in recs] == [32] * 3
