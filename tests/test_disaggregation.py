"""Prefill/decode disaggregation end to end: real prefill and decode servers (127.0.0.1,
ephemeral ports) behind the P/D router, driven with the official openai client and the
harness; the engine's KV export/import; the connector's staging; a decode worker killed
mid-stream (docs/disaggregation.md)."""

from __future__ import annotations

import contextlib
import io
import sys
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.servers.launcher import start_server
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.kv_transfer.connector import LoopbackConnector
from cbbench.reference_engine.kv_transfer.payload import KVLayout, KVPayload
from cbbench.reference_engine.router.serve import RouterOptions, RouterThread
from cbbench.reference_engine.sampling_params import SamplingParams
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console

from tests.server_support import scrape, serve, wait_for_metric

KV_USAGE = "vllm:kv_cache_usage_perc"


def _config(role: str = "both", **kw) -> EngineConfig:
    return EngineConfig(model="tiny", role=role, max_model_len=512, **kw)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, str, str, str]]:
    """(aggregated URL, P/D router URL, prefill URL, decode URL)"""
    with (
        serve(_config()) as (agg, _),
        serve(_config("prefill")) as (pre, _),
        serve(_config("decode")) as (dec, _),
        RouterThread(RouterOptions([], prefill=[pre], decode=[dec], port=0)) as router,
    ):
        yield agg, router, pre, dec


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)


def _completion(url: str, prompt: str, n: int) -> tuple[str, list[int]]:
    r = _client(url).completions.create(
        model="tiny",
        prompt=prompt,
        max_tokens=n,
        temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    return r.choices[0].text, r.choices[0].model_extra["token_ids"]


def _chat_stream(url: str, content: str, n: int) -> tuple[str, list[int], dict]:
    stream = _client(url).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": content}], max_tokens=n,
        temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )  # fmt: skip
    text, ids, info = "", [], {}
    for chunk in stream:
        extra = chunk.model_extra or {}
        info = extra.get("cbbench") or info
        for c in chunk.choices:
            text += c.delta.content or ""
            ids += (c.model_extra or {}).get("token_ids") or []
    return text, ids, info


def test_greedy_outputs_equal_the_aggregated_servers(cluster):
    agg, router, _, _ = cluster
    for prompt, n in (("a", 8), ("the quick brown fox " * 7, 24), ("x" * 300, 12)):
        assert _completion(router, prompt, n) == _completion(agg, prompt, n)
    for content, n in (("hi", 10), ("tell me " * 30, 20)):
        t_pd, ids_pd, info = _chat_stream(router, content, n)
        t_agg, ids_agg, _ = _chat_stream(agg, content, n)
        assert ids_pd == ids_agg and len(ids_pd) == n and t_pd == t_agg
        phases = info["phases"]  # the decode worker's account of the request
        assert phases["kv_transfer_bytes"] > 0 and phases["kv_transfer_s"] > 0
        assert phases["prefill_s"] > 0 and phases["decode_s"] > 0
        assert phases["decode_queue_s"] >= 0 and phases["prefill_queue_s"] >= 0


@pytest.mark.slow
def test_greedy_equality_with_engine_processes():
    """The default `cbbench serve` runs the engine in its own process: the payload crosses
    that IPC both ways (the prefill's last output, the decode's add)."""
    with (
        serve(_config()) as (agg, _),
        serve(_config("prefill"), engine_process=True) as (pre, _),
        serve(_config("decode"), engine_process=True) as (dec, _),
        RouterThread(RouterOptions([], prefill=[pre], decode=[dec], port=0)) as router,
    ):
        assert _completion(router, "the quick brown fox " * 7, 24) == _completion(
            agg, "the quick brown fox " * 7, 24
        )
        t_pd, ids_pd, info = _chat_stream(router, "tell me " * 30, 20)
        assert (t_pd, ids_pd) == _chat_stream(agg, "tell me " * 30, 20)[:2]
        assert info["phases"]["kv_transfer_bytes"] > 0


def test_router_names_both_hops_and_kv_returns_to_zero(cluster):
    _, router, pre, dec = cluster
    r = httpx.post(router + "/v1/completions", timeout=60,
                   json={"model": "tiny", "prompt": "hello", "max_tokens": 4, "logprobs": 2})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
    r = httpx.post(router + "/v1/completions", timeout=60,
                   json={"model": "tiny", "prompt": "hello", "max_tokens": 4})  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.headers["x-cbbench-prefill-replica"] == "p0"
    assert r.headers["x-cbbench-replica"] == "d0"
    m = scrape(router)
    assert m["cbbench:router_pd_requests_total{decode=d0,prefill=p0}"] >= 1
    assert m["cbbench:router_pd_kv_transfer_bytes_total"] > 0
    for url in (pre, dec):
        assert wait_for_metric(url, KV_USAGE, 0.0) == 0.0
    sent = scrape(pre)["cbbench:kv_transfer_bytes_total{direction=sent}"]
    assert sent > 0 and scrape(dec)["cbbench:kv_transfer_bytes_total{direction=received}"] == sent
    assert scrape(pre)["cbbench:kv_transfer_staged_bytes"] == 0  # pulled: nothing waits
    assert scrape(dec)["cbbench:kv_transfer_seconds_count"] >= 1


def test_bench_records_carry_the_transfer_and_the_phases(cluster, tmp_path):
    _, router, _, _ = cluster
    cfg = BenchConfig(base_url=router, workload=Workload("pd", 0, tuple(
        RequestSpec(i, 40 + 16 * i, 6) for i in range(4))), concurrency=2,
        out_dir=tmp_path / "pd", live=False)  # fmt: skip
    res = run_bench(cfg, console=Console(file=io.StringIO()))
    # tiny: 2 layers x (K, V) x 2 heads x 16 dims x 4 bytes = 512 bytes a token, whole blocks
    for r in res.records:
        assert r.ok, r.error
        ph = r.extra["phases"]
        blocks = -(-r.prompt_tokens_server // 16)
        assert ph["kv_transfer_bytes"] == blocks * 16 * 512
        assert ph["kv_transfer_s"] > 0
    summary = res.summary["phases"]
    assert summary["requests"] == 4 and summary["kv_transfer_s"]["count"] == 4
    assert summary["kv_transfer_bytes_total"] == sum(
        r.extra["phases"]["kv_transfer_bytes"] for r in res.records
    )
    from cbbench.harness.cli import main

    md = tmp_path / "report.md"
    assert main(["report", str(tmp_path / "pd"), "--markdown", str(md), "--no-html"]) == 0
    text = md.read_text()
    assert "Per-phase server times" in text and "KV transfer p50/p99 (ms)" in text


def test_the_pd_routers_model_card_says_disaggregated(cluster):
    """A bench through the P/D router recorded the prefill worker's card (`role: prefill`)."""
    _, router, _, _ = cluster
    card = httpx.get(router + "/v1/models", timeout=10).json()["data"][0]
    assert card["id"] == "tiny" and card["cbbench"]["role"] == "disaggregated", card["cbbench"]
    assert card["cbbench"]["workers"] == {"prefill": 1, "decode": 1}


def test_a_failed_pull_is_a_named_error_and_holds_no_block(cluster):
    _, _, pre, dec = cluster
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 4,
            "kv_transfer_params": {"transfer_id": "nope", "remote_url": pre}}  # fmt: skip
    r = httpx.post(dec + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 502 and r.json()["error"]["code"] == "kv_transfer_failed"
    assert "404" in r.json()["error"]["message"]
    assert wait_for_metric(dec, KV_USAGE, 0.0) == 0.0
    # each role refuses the other's hop
    r = httpx.post(pre + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 400 and "--role prefill" in r.json()["error"]["message"]
    body["kv_transfer_params"] = {"do_remote_decode": True}
    r = httpx.post(dec + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 400 and "--role decode" in r.json()["error"]["message"]


def test_engine_ships_kv_in_the_cache_dtype():
    """int8 KV travels as int8 (+ a scale byte a row): 17/64 of fp32's bytes, same tokens."""
    prompt = list(range(3, 40))
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    sizes = {}
    for kv_dtype in ("auto", "int8"):
        cfg = EngineConfig(model="tiny", kv_cache_dtype=kv_dtype, attention_backend="torch")
        agg, pre, dec = (LLMEngine.from_config(cfg) for _ in range(3))
        agg.add_request("a", prompt, greedy)
        pre.add_request("a", prompt, SamplingParams(max_tokens=1, temperature=0), kv_export=True)
        want = _drain(agg)["a"]
        payload = _drain(pre)["a:kv"]
        assert pre.block_manager.num_used_blocks == 0  # freed once copied out
        dec.add_request("a", prompt, greedy, kv_import=payload)
        got = _drain(dec)
        assert got["a"] == want and dec.block_manager.num_used_blocks == 0
        sizes[kv_dtype] = payload.nbytes
    assert sizes["int8"] * 64 == sizes["auto"] * 17


def _drain(engine: LLMEngine) -> dict:
    out: dict = {}
    for _ in range(1000):
        if not engine.has_unfinished_requests():
            return out
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.kv_transfer is not None:
                out[o.request_id + ":kv"] = o.kv_transfer
        engine.check_invariants()
    raise AssertionError("engine did not drain")


def test_connector_stages_once_and_expires():
    layout = KVLayout(1, 16, 1, 4, "torch.float32")
    c = LoopbackConnector(ttl_s=0.05, max_staged_bytes=100)
    p = c.stage(KVPayload(layout, 3, 7, b"x" * 60))
    assert c.take(p["transfer_id"]).first_token_id == 7 and c.take(p["transfer_id"]) is None
    c.stage(KVPayload(layout, 3, 7, b"x" * 60))
    c.stage(KVPayload(layout, 3, 7, b"x" * 60))  # the first no longer fits: dropped
    assert c.num_staged == 1 and c.staged_bytes == 60
    time.sleep(0.06)
    assert c.take("anything") is None and c.num_staged == 0 and c.num_expired == 2


@contextlib.contextmanager
def _decode_process():
    cmd = [sys.executable, "-m", "cbbench.harness.cli", "serve", "--model", "tiny", "--role",
           "decode", "--max-model-len", "2048", "--host", "127.0.0.1", "--port", "0",
           "--no-engine-process"]  # fmt: skip
    handle = start_server(cmd, 120.0, name="decode worker")
    try:
        yield handle
    finally:
        handle.stop()


def test_killing_the_decode_worker_mid_stream_ends_the_request_by_name():
    with (
        serve(_config("prefill")) as (pre, _),
        _decode_process() as dec,
        RouterThread(
            RouterOptions([], prefill=[pre], decode=[dec.base_url], port=0, poll_interval_s=0.2)
        ) as router,  # fmt: skip
    ):
        stream = _client(router).completions.create(
            model="tiny",
            prompt="long story",
            max_tokens=2000,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        got = 0
        with pytest.raises(openai.APIError) as err:
            for _chunk in stream:
                got += 1
                if got == 3:
                    dec.process.kill()
        assert got >= 3 and "decode_worker_failed" in str(err.value.body or err.value)
        assert wait_for_metric(pre, KV_USAGE, 0.0) == 0.0
        ok = _client(pre).completions.create(model="tiny", prompt="still here", max_tokens=3)
        assert ok.usage.completion_tokens == 3  # the prefill worker keeps serving
        for _ in range(100):  # the router takes the dead worker out; a request is a 503
            r = httpx.post(router + "/v1/completions", timeout=30,
                           json={"model": "tiny", "prompt": "x", "max_tokens": 2})  # fmt: skip
            if r.status_code == 503:
                break
            time.sleep(0.1)
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_decode_worker"
        assert wait_for_metric(pre, KV_USAGE, 0.0) == 0.0


def test_decode_engine_with_async_scheduling_and_edge_cases():
    """A decode engine with async scheduling continues token for token; a first token that
    ends the request finishes it unscheduled; an abort before admission leaves nothing."""
    prompts = [list(range(3, 3 + n)) for n in (5, 17, 40)]
    greedy = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    agg, pre = (LLMEngine.from_config(EngineConfig(model="tiny")) for _ in range(2))
    dec = LLMEngine.from_config(EngineConfig(model="tiny", async_scheduling=True))
    for i, p in enumerate(prompts):
        agg.add_request(f"r{i}", p, greedy)
        pre.add_request(f"r{i}", p, SamplingParams(max_tokens=1, temperature=0), kv_export=True)
    want, shipped = _drain(agg), _drain(pre)
    for i, p in enumerate(prompts):
        dec.add_request(f"r{i}", p, greedy, kv_import=shipped[f"r{i}:kv"])
    got = _drain(dec)
    assert all(got[f"r{i}"] == want[f"r{i}"] for i in range(3))
    one = SamplingParams(max_tokens=1, temperature=0)
    dec.add_request("one", prompts[0], one, kv_import=shipped["r0:kv"])
    assert _drain(dec) == {"one": [shipped["r0:kv"].first_token_id]}
    dec.add_request("gone", prompts[1], greedy, kv_import=shipped["r1:kv"])
    dec.abort_request("gone")
    assert _drain(dec) == {} and dec.block_manager.num_used_blocks == 0
    with pytest.raises(EngineError, match="payload holds"):
        dec.add_request("bad", prompts[2][:-1], greedy, kv_import=shipped["r2:kv"])
    assert not dec.has_unfinished_requests()
