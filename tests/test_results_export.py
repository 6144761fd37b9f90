"""`cbbench export RUN --benchmark-report PATH` and `bench --benchmark-report`: a bench run,
a sweep and a router run as llm-d benchmark reports v0.2.1, valid against the published
JSON Schema (vendored in tests/fixtures/exchange/llm-d-benchmark/); importing one back gives
the same aggregates; the environment (server, GPU or its absence, host, command) is in
run.json, the report's header and the exported `scenario`."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from cbbench.harness.cli import main
from cbbench.harness.client.api import probe_server
from cbbench.harness.client.server_info import cache_config_info, server_identity
from cbbench.harness.report import build_report
from cbbench.harness.results.environment import environment
from cbbench.harness.results.formats.benchmark_report import to_benchmark_report
from cbbench.harness.results.run_folder import load_run
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.router.serve import RouterOptions, RouterThread
from servers.fake import Behavior, FakeServerConfig, threaded

from tests.server_support import serve

FX = Path(__file__).parent / "fixtures" / "exchange"
SCHEMA = json.loads((FX / "llm-d-benchmark" / "br_v0_2_1_json_schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
FAST = Behavior(ttft_s=0.01, itl_s=0.002, tokens_per_chunk=1)
COMMON = ["--workload", "prompt=16,output=8", "--num-requests", "24", "--no-live"]
COMMON += ["--no-server-metrics", "--no-gpu-metrics", "--seed", "3"]


def valid(report: dict) -> dict:
    errors = sorted(VALIDATOR.iter_errors(report), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message[:200]}" for e in errors[:5]]
    return report


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "run"
    br = out.parent / "report.json"
    with threaded(FakeServerConfig(default=FAST)) as srv:
        argv = ["bench", "--base-url", srv.url, "--concurrency", "4", "--out", str(out)]
        assert main([*argv, *COMMON, "--benchmark-report", str(br)]) == 0
    return out


def test_bench_writes_a_valid_report_and_it_imports_back_with_the_same_aggregates(
    bench_run, tmp_path
):
    report = valid(json.loads((bench_run.parent / "report.json").read_text()))
    assert report["version"] == "0.2.1"
    agg = report["results"]["request_performance"]["aggregate"]
    assert agg["requests"]["total"] == 24 and agg["requests"]["failures"] == 0
    assert agg["latency"]["time_to_first_token"]["units"] == "s"
    extras = report["results"]["observability"]["metadata"]["cbbench"]
    assert extras["server_queue_s"]["count"] == 24  # cbbench's own figure, in metadata
    assert "ttfo_s" in extras and "timing_bound_s" in extras
    back = tmp_path / "back"
    assert main(["import", str(bench_run.parent / "report.json"), "--out", str(back)]) == 0
    orig, again = build_report([str(bench_run), str(back)]).rows
    for key in (
        "ttft.p50",
        "ttft.p99",
        "ttft.mean",
        "tpot.p50",
        "e2e.p99",
        "request_throughput",
        "output_throughput",
    ):
        assert again[key] == pytest.approx(orig[key], rel=1e-9), key
    assert load_run(back).meta["imported"]["definitions"] == []  # cbbench's own definitions


def test_yaml_by_suffix_and_bad_suffix(bench_run, tmp_path, capsys):
    out = tmp_path / "r.yaml"
    assert main(["export", str(bench_run), "--benchmark-report", str(out)]) == 0
    valid(yaml.safe_load(out.read_text()))
    assert main(["export", str(bench_run), "--benchmark-report", str(tmp_path / "r.txt")]) == 2
    assert ".json or .yaml" in capsys.readouterr().err


def test_environment_recorded_once_in_run_json_report_and_scenario(bench_run):
    meta = load_run(bench_run).meta
    env = meta["environment"]
    assert env["server"]["same_host"] is True  # 127.0.0.1
    report = json.loads((bench_run.parent / "report.json").read_text())
    engine, client = report["scenario"]["stack"]
    assert engine["standardized"]["kind"] == "inference_engine"
    assert client["standardized"]["tool"] == "cbbench"
    assert report["scenario"]["load"]["native"]["args"]["argv"] == meta["command"]
    md = build_report([str(bench_run)]).markdown()
    if not env["gpus"]:  # this machine: no GPU, said once, as a fact not a warning
        assert env["gpu"].startswith("no GPU found")
        assert engine["standardized"]["accelerator"]["count"] == 0
        assert md.count(env["gpu"]) == 1 and "warning" not in env["gpu"]
    else:
        assert "gpu" not in env and env["gpus"][0]["driver"]


def test_a_sweep_exports_one_valid_report_per_level(tmp_path):
    out = tmp_path / "sweep"
    with threaded(FakeServerConfig(default=FAST)) as srv:
        argv = ["sweep", "--base-url", srv.url, "--concurrency", "1,3", "--out", str(out)]
        assert main([*argv, *COMMON]) == 0
    assert main(["export", str(out), "--benchmark-report", str(tmp_path / "s.json")]) == 0
    for level, conc in (("concurrency-1", 1), ("concurrency-3", 3)):
        r = valid(json.loads((tmp_path / f"s.{level}.json").read_text()))
        assert r["scenario"]["load"]["standardized"]["concurrency"] == conc
    md = build_report([str(out)]).markdown()  # levels share host and GPU: said once
    assert md.count("client host:") == 1 and "- all runs: client host" in md


def test_a_router_run_exports_its_replica_figures_in_metadata(tmp_path):
    a = threaded(FakeServerConfig(default=FAST))
    b = threaded(FakeServerConfig(default=Behavior(ttft_s=0.05, itl_s=0.002)))
    with (
        a as fa,
        b as fb,
        RouterThread(RouterOptions([fa.url, fb.url], policy="round-robin", port=0)) as url,
    ):
        argv = ["bench", "--base-url", url, "--concurrency", "4", "--out", str(tmp_path / "run")]
        argv += ["--workload", "prompt=16,output=8", "--num-requests", "24", "--no-live"]
        argv += ["--no-gpu-metrics", "--metrics-interval", "0.05"]
        assert main(argv) == 0
    report = valid(to_benchmark_report(load_run(tmp_path / "run")))
    replicas = report["results"]["observability"]["metadata"]["cbbench"]["replicas"]
    assert set(replicas["per_replica"]) == {"r0", "r1"}


def test_an_aggregate_only_import_exports_valid_too(tmp_path):
    out = tmp_path / "agg"
    assert (
        main(["import", str(FX / "aiperf" / "profile_export_aiperf.json.gz"), "--out", str(out)])
        == 0
    )
    report = valid(to_benchmark_report(load_run(out)))
    assert report["scenario"]["load"]["standardized"]["tool"] == "aiperf"
    assert "AIPerf TTFT" in json.dumps(report["results"]["observability"]["metadata"])


def test_the_native_inference_perf_report_is_valid_against_the_vendored_schema():
    valid(
        yaml.safe_load((FX / "llm-d-benchmark" / "inference-perf.partial.stage_0.yaml").read_text())
    )


def test_server_identity_of_the_reference_engine_is_its_whole_config():
    with serve(EngineConfig(model="tiny", executor="sim", block_size=8)) as (url, _stack):
        engine = probe_server(url)
        ident = server_identity(url, engine)
        import httpx

        info = cache_config_info(httpx.get(url + "/metrics", timeout=10).text)
    assert ident["name"] == "cbbench" and ident["same_host"]
    config = ident["config"]  # the whole EngineConfig, nested settings too
    assert config["model"] == "tiny" and config["executor"] == "sim" and config["block_size"] == 8
    assert "max_num_seqs" in config["continuous"]
    assert info["block_size"] == str(engine["cbbench"]["block_size"])  # vLLM's info gauge


def test_no_gpu_is_a_fact_in_the_environment():
    env = environment()
    assert isinstance(env["gpus"], list)
    assert ("gpu" in env) == (not env["gpus"])


class JsonPaths:
    """A real HTTP server on 127.0.0.1 answering GET `path` with `routes[path]` (200), else
    404; it counts the paths asked."""

    def __init__(self, routes: dict[str, str]) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.asked: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                outer.asked.append(self.path)
                body = routes.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_vllm_and_sglang_say_who_they_are():
    from cbbench.harness.report.provenance import environment_lines

    from tests.telemetry_server import fixture

    models = {"data": [{"id": "m", "owned_by": "vllm", "max_model_len": 4096}]}
    routes = {"/v1/models": json.dumps(models), "/version": '{"version": "0.11.0"}'}
    routes["/metrics"] = fixture("vllm.txt")
    with JsonPaths(routes) as url:
        ident = server_identity(url, probe_server(url))
    assert ident["name"] == "vllm" and ident["version"] == "0.11.0"
    assert ident["cache_config_info"]["gpu_memory_utilization"] == "0.9"
    assert ident["model_card"]["max_model_len"] == 4096
    line = environment_lines({"environment": {"server": ident}})[0]
    assert line.startswith("server: vllm 0.11.0; block_size 16, gpu_memory_utilization 0.9")
    info = {"version": "0.5.1", "max_running_requests": 64, "chunked_prefill_size": 8192}
    sgl = {"/v1/models": json.dumps({"data": [{"id": "m", "owned_by": "sglang"}]})}
    sgl["/get_server_info"] = json.dumps(info)
    with JsonPaths(sgl) as url:
        ident = server_identity(url, probe_server(url))
    assert ident["name"] == "sglang" and ident["version"] == "0.5.1"
    assert ident["server_info"]["chunked_prefill_size"] == 8192
    sgl["/server_info"] = json.dumps({**info, "version": "0.5.4"})  # newer: /server_info
    with JsonPaths(sgl) as url:
        assert server_identity(url, probe_server(url))["version"] == "0.5.4"
    bare = JsonPaths({"/v1/models": json.dumps({"data": [{"id": "m"}]})})
    with bare as url:  # a server that names no engine: nothing asked beyond /v1/models
        ident = server_identity(url, probe_server(url))
    assert ident["name"] == "unknown" and "version" not in ident
    assert bare.asked == ["/v1/models"]


def test_a_partial_run_is_exported_with_a_warning_it_carries(tmp_path, capsys):
    from tests.report_synth import write_run

    run = write_run(tmp_path / "cut", n=30, meta={"status": "interrupted", "interrupted": True})
    out = tmp_path / "cut.json"
    assert main(["export", str(run), "--benchmark-report", str(out)]) == 0
    err = capsys.readouterr().err
    assert "cbbench export: warning:" in err and "partial" in err
    report = valid(json.loads(out.read_text()))
    assert report["results"]["observability"]["metadata"]["cbbench"]["trust_problems"]


def test_sampled_server_series_go_to_the_schemas_own_fields(tmp_path):
    from tests.report_synth import write_run

    run = write_run(tmp_path / "tel", n=30)
    samples = [
        {"t_s": i * 0.5, "source": "server", "running": i, "kv_usage": i / 10} for i in range(5)
    ]
    samples.append({"t_s": 0.1, "source": "client", "running": 99})  # not the server's
    with open(run / "timeseries.jsonl", "a") as fh:
        fh.writelines(json.dumps(s) + "\n" for s in samples)
    loaded = load_run(run)
    server = [x for x in loaded.timeseries if x.get("source") == "server"]
    running = [x["running"] for x in server if "running" in x]
    kv = [x["kv_usage"] for x in server if "kv_usage" in x]
    report = valid(to_benchmark_report(loaded))
    (comp,) = report["results"]["observability"]["components"]
    assert comp["component_label"] == report["scenario"]["stack"][0]["metadata"]["label"]
    agg = comp["aggregate"]
    assert agg["running_requests"]["max"] == max(running) < 99  # the client's 99 left out
    assert agg["running_requests"]["units"] == "count"
    assert agg["kv_cache_usage"]["mean"] == pytest.approx(100 * sum(kv) / len(kv))  # percent
    assert agg["gpu_utilization"]["max"] <= 100 and agg["gpu_utilization"]["units"] == "percent"
    assert "power_consumption" not in agg  # not sampled: left out, never zero
