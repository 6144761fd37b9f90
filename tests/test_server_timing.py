"""The server's own per-request times: vLLM's `metrics`, llama.cpp's `timings`, the reference
engine's stamps, parsed by the client, recorded, and split into where the time went; and the
server's batching settings read from /v1/models and vLLM's cache_config_info."""

from __future__ import annotations

import json

import pytest
from cbbench.harness.client.server_timing import server_times
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.summary import summarize
from cbbench.harness.results.time_split import time_split, time_split_line
from cbbench.harness.telemetry.server_settings import from_metrics, from_models


def test_vllm_metrics_llamacpp_timings_and_engine_stamps():
    v = server_times({"metrics": {"queue_time_ms": 12.5, "time_to_first_token_ms": 40.0,
                                  "generation_time_ms": 900.0, "mean_itl_ms": 9.0}})  # fmt: skip
    assert v == {"source": "vllm", "queue_s": 0.0125, "prefill_s": 0.04, "decode_s": 0.9}
    lc = server_times({"timings": {"prompt_ms": 30.0, "predicted_ms": 500.0, "prompt_n": 9}})
    assert lc == {"source": "llama.cpp", "queue_s": None, "prefill_s": 0.03, "decode_s": 0.5}
    c = server_times({"cbbench": {"queue_time_s": 0.1, "prefill_time_s": 0.2,
                                  "decode_time_s": 0.3, "scheduler": "continuous"}})  # fmt: skip
    assert c == {"source": "cbbench", "queue_s": 0.1, "prefill_s": 0.2, "decode_s": 0.3}
    # garbage is no time, not a crash
    assert server_times({"metrics": {"queue_time_ms": "x", "generation_time_ms": -1}})[
        "queue_s"] is None  # fmt: skip
    assert server_times({}) is None


def _rec(i: int, e2e: float, timing: dict | None) -> RequestRecord:
    r = RequestRecord(f"r{i}", i, 10, 5, sent_s=0.0, first_token_s=0.1, last_token_s=e2e,
                      ttft_s=0.1, e2e_s=e2e, output_tokens_client=5)  # fmt: skip
    if timing is not None:
        r.extra["server_timing"] = timing
    return r


def test_where_the_time_went_in_the_summary():
    recs = [_rec(i, 1.0, {"source": "vllm", "queue_s": 0.1, "prefill_s": 0.2, "decode_s": 0.6})
            for i in range(3)] + [_rec(3, 2.0, None)]  # fmt: skip
    split = time_split(recs)
    assert split["count"] == 3 and split["e2e_s"] == pytest.approx(1.0)
    assert split["remainder_s"] == pytest.approx(0.1)
    line = time_split_line(split)
    assert "queue 100.0 ms (10%)" in line and "client + network 100.0 ms (10%)" in line
    # whose times: the server's ("cbbench's own times" read as the load generator's)
    assert "the vllm server's own times" in line
    assert summarize(recs)["server_timing"]["decode_s"] == pytest.approx(0.6)
    assert "server_timing" not in summarize([_rec(0, 1.0, None)])
    # no queue time from the server: the remainder holds it, and the line says so
    lc = time_split([_rec(0, 1.0, {"source": "llama.cpp", "queue_s": None, "prefill_s": 0.2,
                                   "decode_s": 0.6})])  # fmt: skip
    assert lc["queue_s"] is None and lc["remainder_s"] == pytest.approx(0.2)
    assert "queue included" in time_split_line(lc)


def test_a_real_engine_run_records_its_stamps_per_request(tmp_path):
    """A bench run against the reference engine over HTTP: each record carries the engine's
    queue, prefill and decode times, and the summary splits the E2E with them."""
    from cbbench.harness.cli import main
    from cbbench.reference_engine.config.engine_config import EngineConfig

    from tests.server_support import serve

    with serve(EngineConfig(model="tiny", max_model_len=128)) as (url, _):
        assert main(["bench", "--base-url", url, "--workload", "prompt=16,output=8",
                     "--num-requests", "6", "--rate", "inf", "--no-live",
                     "--out", str(tmp_path / "run")]) == 0  # fmt: skip
    lines = (tmp_path / "run" / "requests.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    for r in recs:
        t = r["extra"]["server_timing"]
        assert t["source"] == "cbbench" and t["decode_s"] > 0 and t["prefill_s"] > 0
        assert t["queue_s"] == r["server_queue_s"]
        assert t["queue_s"] + t["prefill_s"] + t["decode_s"] <= r["e2e_s"] + 0.05
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["summary"]["server_timing"]["count"] == 6
    settings = meta["target"]["server_settings"]
    assert settings["max_model_len"] == 128 and settings["block_size"] >= 1
    assert "num_kv_blocks" in settings and "max_num_seqs" in settings


def test_server_settings_from_vllm_metrics_and_models():
    text = ('# HELP vllm:cache_config_info x\n# TYPE vllm:cache_config_info gauge\n'
            'vllm:cache_config_info{block_size="128",cache_dtype="auto",'
            'enable_prefix_caching="True",engine="0",num_gpu_blocks="227"} 1.0\n')  # fmt: skip
    assert from_metrics(text) == {"block_size": 128, "num_kv_blocks": 227,
                                  "enable_prefix_caching": True}  # fmt: skip
    assert from_metrics("vllm:num_requests_running 3\n") == {}
    assert from_models({"max_model_len": 2048, "cbbench": {"num_seqs_limit": 8,
                        "max_num_batched_tokens": 512, "block_size": 16}}) == {
        "max_model_len": 2048, "max_num_seqs": 8, "max_num_batched_tokens": 512,
        "block_size": 16}  # fmt: skip
