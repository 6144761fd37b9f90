"""SGLang's, TGI's and llama.cpp's own settings endpoints (harness/telemetry/foreign_settings.py)
read by `cbbench bench` into run.json's `target.server_settings`, and the "read with care" line
of gate and report when two runs' settings differ. The server is the reference engine on
127.0.0.1 with the foreign server's /v1/models card and settings endpoint in front, each payload
in the shape of that server's source (cited per payload)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from cbbench.harness.cli import main
from cbbench.harness.telemetry.foreign_settings import from_llamacpp, from_sglang, from_tgi
from cbbench.harness.telemetry.server_settings import read_server_settings
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.server.runner import ThreadedServer
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Mount, Route

from tests.server_support import serve

# sgl-project/sglang python/sglang/srt/entrypoints/http_server.py, `get_server_info`:
# dataclasses.asdict(server_args) | scheduler_info | internal_states | version
SGLANG = {
    "model_path": "/models/tiny", "tp_size": 1, "dp_size": 1, "pp_size": 1,
    "max_running_requests": 64, "chunked_prefill_size": 8192, "max_prefill_tokens": 16384,
    "disable_radix_cache": False, "schedule_policy": "fcfs", "kv_cache_dtype": "auto",
    "page_size": 1, "context_length": None, "mem_fraction_static": 0.88,
    "max_total_num_tokens": 500000, "max_req_input_len": 4090,
    "internal_states": [{"last_gen_throughput": 0.0}], "version": "0.5.4",
}  # fmt: skip
# huggingface/text-generation-inference router/src/lib.rs `Info` (served at /info by
# router/src/server.rs `get_model_info`); max_batch_size & co. from the 1.x/2.0 router
TGI = {
    "model_id": "tiny", "model_sha": None, "model_pipeline_tag": "text-generation",
    "max_concurrent_requests": 128, "max_best_of": 2, "max_stop_sequences": 4,
    "max_input_tokens": 1024, "max_total_tokens": 2048, "waiting_served_ratio": 0.3,
    "max_batch_total_tokens": 32000, "max_waiting_tokens": 20, "max_batch_size": None,
    "validation_workers": 2, "max_client_batch_size": 4, "router": "text-generation-router",
    "version": "2.0.4", "sha": None, "docker_label": None,
}  # fmt: skip
# ggml-org/llama.cpp tools/server/server-context.cpp `get_props`
LLAMACPP = {
    "default_generation_settings": {"params": {"n_predict": -1, "temperature": 0.8},
                                    "n_ctx": 4096},
    "total_slots": 4, "model_alias": "tiny", "model_path": "/models/tiny.gguf",
    "modalities": {"vision": False, "audio": False}, "chat_template": "", "bos_token": "<s>",
    "eos_token": "</s>", "build_info": "b6000-abc",
}  # fmt: skip

OWNER = {"sglang": "sglang", "tgi": "tiny", "llamacpp": "llamacpp"}  # TGI: owned by its model
PATH = {"sglang": "/server_info", "tgi": "/info", "llamacpp": "/props"}


def test_each_server_in_cbbench_names_and_its_own() -> None:
    assert from_sglang(SGLANG) == {
        "max_num_seqs": 64, "enable_chunked_prefill": True, "max_num_batched_tokens": 8192,
        "enable_prefix_caching": True, "block_size": 1, "num_kv_blocks": 500000,
        "tensor_parallel_size": 1, "kv_cache_dtype": "auto", "schedule_policy": "fcfs",
        "chunked_prefill_size": 8192, "max_prefill_tokens": 16384, "dp_size": 1, "pp_size": 1,
        "max_total_num_tokens": 500000, "mem_fraction_static": 0.88}  # fmt: skip
    off = from_sglang({**SGLANG, "chunked_prefill_size": -1, "disable_radix_cache": True})
    assert off["enable_chunked_prefill"] is False and off["max_num_batched_tokens"] == 16384
    assert off["enable_prefix_caching"] is False
    # newer: the cap the scheduler resolved, per DP rank, and its KV capacity
    auto = {**SGLANG, "max_running_requests": None, "dp_size": 2, "max_total_num_tokens": None,
            "internal_states": [{"effective_max_running_requests_per_dp": 48,
                                 "memory_usage": {"kvcache": 0.2, "token_capacity": 20480}}]}
    assert from_sglang(auto)["max_num_seqs"] == 48 and from_sglang(auto)["num_kv_blocks"] == 20480
    # a total across 2 DP ranks without the per-rank cap: not an engine's max_num_seqs
    assert "max_num_seqs" not in from_sglang({**SGLANG, "dp_size": 2})
    tgi = from_tgi(TGI)
    assert "max_num_seqs" not in tgi  # max_batch_size null: TGI did not say
    assert tgi["max_model_len"] == 2048 and tgi["max_concurrent_requests"] == 128
    assert from_tgi({**TGI, "max_batch_size": 32})["max_num_seqs"] == 32
    assert from_llamacpp(LLAMACPP) == {"max_num_seqs": 4, "max_model_len": 4096}
    for parse in (from_sglang, from_tgi, from_llamacpp):
        assert parse(None) == parse([1, 2]) == parse({"detail": "x"}) == {}


class Foreign:
    """The reference engine behind a foreign server's /v1/models card and settings endpoint:
    `payload` is what the endpoint answers (a dict: JSON; "404"; "junk"; "hang")."""

    def __init__(self, url_engine_app) -> None:
        self.kind, self.payload, self.hits, self.older = "sglang", SGLANG, 0, False
        self.app = Starlette(routes=[
            Route("/v1/models", self.models),
            *[Route(p, self.settings) for p in ("/server_info", "/get_server_info", "/info",
                                                "/props")],
            Mount("/", app=url_engine_app),
        ])  # fmt: skip

    async def models(self, request):
        card = {"id": "tiny", "object": "model", "owned_by": OWNER[self.kind], "created": 0}
        return JSONResponse({"object": "list", "data": [card]})

    async def settings(self, request):
        served = "/get_server_info" if self.older else PATH[self.kind]
        if request.url.path != served:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        self.hits += 1
        if self.payload == "404":
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        if self.payload == "junk":
            return PlainTextResponse("<html>not json</html>")
        if self.payload == "hang":
            await asyncio.sleep(1.0)
            return JSONResponse({})
        return JSONResponse(self.payload)


@pytest.fixture(scope="module")
def foreign():
    with serve(EngineConfig(model="tiny", max_model_len=128)) as (url, stack):
        f = Foreign(stack.app)
        with ThreadedServer(f.app) as front:
            f.url = front
            yield f


def _bench(foreign: Foreign, out: Path) -> dict:
    argv = ["bench", "--base-url", foreign.url, "--workload", "prompt=16,output=4",
            "--num-requests", "20", "--concurrency", "4", "--no-live", "--seed", "1",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    return json.loads((out / "run.json").read_text())["target"]["server_settings"]


@pytest.mark.parametrize(
    ("kind", "payload", "changed", "line"),
    [
        ("sglang", SGLANG, {"max_running_requests": 128}, "max_num_seqs: baseline 64, candidate 128"),
        ("tgi", TGI, {"max_concurrent_requests": 16},
         "max_concurrent_requests: baseline 128, candidate 16"),
        ("llamacpp", LLAMACPP, {"total_slots": 8}, "max_num_seqs: baseline 4, candidate 8"),
    ],
)  # fmt: skip
def test_bench_records_them_and_gate_report_read_with_care(
    foreign, tmp_path, capsys, kind, payload, changed, line
) -> None:
    foreign.kind, foreign.payload, foreign.hits, foreign.older = kind, payload, 0, False
    a = _bench(foreign, tmp_path / "a")
    assert foreign.hits == 1  # one GET
    foreign.payload = {**payload, **changed}
    b = _bench(foreign, tmp_path / "b")
    if kind == "sglang":
        assert a["max_num_seqs"] == 64 and a["schedule_policy"] == "fcfs"
        assert a["enable_prefix_caching"] is True and b["max_num_seqs"] == 128
        # calibrate replays with the settings it knows; SGLang's own ones stay in run.json
        hw = tmp_path / "hw.json"
        assert main(["calibrate", "--from-run", str(tmp_path / "a"), "--model", "tiny",
                     "--out", str(hw)]) == 0  # fmt: skip
        fitted = json.loads(hw.read_text())["fit"]["server_settings"]
        assert fitted["max_num_seqs"] == 64 and "schedule_policy" not in fitted
    elif kind == "tgi":
        assert a["max_concurrent_requests"] == 128 and "max_num_seqs" not in a
    else:
        assert a["max_num_seqs"] == 4 and b["max_num_seqs"] == 8
    capsys.readouterr()
    policy = tmp_path / "e2e.toml"
    policy.write_text('[[rules]]\nmetric = "e2e"\nstat = "p50"\nmax_increase = 10.0\n')
    rc = main(["gate", "--baseline", str(tmp_path / "a"), "--candidate", str(tmp_path / "b"),
               "--policy-file", str(policy)])  # fmt: skip
    out, err = capsys.readouterr()
    assert rc in (0, 1) and "not comparable" not in err, err
    assert "read with care: runs differ in" in out and line in out, out
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"),
                 "--out", str(tmp_path / "r.html")]) == 0  # fmt: skip
    err = capsys.readouterr().err
    if kind == "llamacpp":  # the header names what the server told, in cbbench's names
        header = next(x for x in (tmp_path / "r.html").read_text().split("<") if "server: " in x)
        assert "max_num_seqs 4," in header and "max_model_len 4096" in header
    aspect = line.split(":")[0]
    assert f"cbbench report: read with care: {aspect} differs (a: " in err, err


@pytest.mark.parametrize("kind", ["llamacpp", "sglang"])
@pytest.mark.parametrize("payload", ["404", "junk"])
def test_a_server_without_the_endpoint_or_with_junk_runs_as_before(
    foreign, tmp_path, payload, kind
):
    foreign.kind, foreign.payload, foreign.hits, foreign.older = kind, payload, 0, False
    settings = _bench(foreign, tmp_path / "r")
    assert foreign.hits == 1 and "max_num_seqs" not in settings  # one try, nothing guessed


def test_a_hanging_endpoint_is_one_bounded_try(foreign) -> None:
    foreign.kind, foreign.payload, foreign.hits, foreign.older = "tgi", "hang", 0, False
    engine = {"models": ["tiny"], "owned_by": "tiny"}
    assert read_server_settings(None, engine, timeout_s=0.3, base_url=foreign.url) == {}
    assert foreign.hits == 1


def test_sglang_before_server_info_answers_at_get_server_info(foreign) -> None:
    """An SGLang without /server_info (404) is asked once more at /get_server_info."""
    foreign.kind, foreign.payload, foreign.hits, foreign.older = "sglang", SGLANG, 0, True
    engine = {"models": ["tiny"], "owned_by": "sglang"}
    got = read_server_settings(None, engine, base_url=foreign.url)
    assert got["max_num_seqs"] == 64 and got["tensor_parallel_size"] == 1
    assert foreign.hits == 1
