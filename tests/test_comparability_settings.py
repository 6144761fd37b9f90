"""The server's batching and thread settings where two runs meet (results/comparability.py,
harness/telemetry/server_settings.py): runs of one server at different CPU thread counts or
batch limits are compared with a "read with care" line, never silently; a setting the server
did not tell is "unknown". Real runs of `cbbench bench` against the reference engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cbbench.harness.cli import main
from cbbench.harness.results.comparability import CAUTION, among, differences
from cbbench.harness.telemetry.server_settings import from_server_info, read_server_settings
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.server.runner import ThreadedServer
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from tests.server_support import serve


@pytest.fixture(scope="module")
def thread_runs(tmp_path_factory) -> dict[int, Path]:
    """One tiny reference engine run at 1 torch thread, one at 2 (CBBENCH_TORCH_THREADS)."""
    root = tmp_path_factory.mktemp("threads")
    before = torch.get_num_threads()
    mp = pytest.MonkeyPatch()
    out = {}
    try:
        for n in (1, 2):
            mp.setenv("CBBENCH_TORCH_THREADS", str(n))
            with serve(EngineConfig(model="tiny", max_model_len=128)) as (url, _):
                argv = ["bench", "--base-url", url, "--workload", "prompt=16,output=4",
                        "--num-requests", "24", "--concurrency", "4", "--no-live", "--seed", "1",
                        "--out", str(root / f"t{n}")]  # fmt: skip
                assert main(argv) == 0
            out[n] = root / f"t{n}"
    finally:
        mp.undo()
        torch.set_num_threads(before)
    return out


def _meta(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def test_runs_record_the_engines_threads_and_differ_with_care(thread_runs) -> None:
    a, b = _meta(thread_runs[1]), _meta(thread_runs[2])
    assert a["target"]["server_settings"]["cpu_threads"] == 1
    assert b["target"]["server_settings"]["cpu_threads"] == 2
    d = {x.aspect: x for x in differences(a, b)}
    assert d["cpu threads"].severity == CAUTION and (d["cpu threads"].a, d["cpu threads"].b) == (
        "1", "2")  # fmt: skip
    assert "max_num_seqs" not in d  # the same on both sides: nothing to say
    assert not [x for x in differences(a, a)]


def test_gate_and_report_say_read_with_care(thread_runs, tmp_path, capsys) -> None:
    capsys.readouterr()
    # E2E only: 4-token outputs can reach a loaded client in one read, a TPOT p50 of 0 that
    # the default policy's ratio refuses (exit 2, seen here); the comparison line is the point
    policy = tmp_path / "e2e.toml"
    policy.write_text('[[rules]]\nmetric = "e2e"\nstat = "p50"\nmax_increase = 10.0\n')
    rc = main(["gate", "--baseline", str(thread_runs[1]), "--candidate", str(thread_runs[2]),
               "--policy-file", str(policy)])  # fmt: skip
    out, err = capsys.readouterr()
    assert rc in (0, 1) and "not comparable" not in err, err  # comparable: judged
    assert "read with care: runs differ in cpu threads: baseline 1, candidate 2" in out
    md, html = tmp_path / "r.md", tmp_path / "r.html"
    argv = ["report", str(thread_runs[1]), str(thread_runs[2]), "--out", str(html)]
    assert main([*argv, "--markdown", str(md)]) == 0
    err = capsys.readouterr().err
    assert "cbbench report: read with care: cpu threads differs (t1: 1, t2: 2)" in err
    assert "**Read with care:** cpu threads differs (t1: 1, t2: 2)" in md.read_text()
    assert "Read with care: cpu threads differs" in html.read_text()


def _settings_meta(settings: dict | None) -> dict:
    target = {"endpoint": "chat", "model": "m"}
    if settings is not None:
        target["server_settings"] = settings
    return {"target": target, "load": {"rate": 1.0}}


def test_a_setting_the_server_did_not_tell_is_unknown() -> None:
    """vLLM without /server_info tells no max_num_seqs: against a server that does, that is a
    caution ("unknown"); both unknown, or a run that recorded no settings (older): nothing."""
    vllm, cb = _settings_meta({"block_size": 16}), _settings_meta({"max_num_seqs": 8})
    d = {x.aspect: x for x in differences(vllm, cb)}
    assert d["max_num_seqs"].severity == CAUTION
    assert (d["max_num_seqs"].a, d["max_num_seqs"].b) == ("unknown", "8")
    assert "cpu threads" not in d  # unknown on both sides
    assert differences(_settings_meta(None), cb) == []  # an older run.json: not recorded
    lines = among([("v", vllm), ("c", cb), ("old", _settings_meta(None))])
    assert (CAUTION, "max_num_seqs differs (v: unknown, c: 8, old: unknown)") in lines


# vLLM's /server_info?config_format=json (VLLM_SERVER_DEV_MODE=1;
# vllm/entrypoints/serve/dev/server_info/api_router.py): VllmConfig dumped by pydantic
SERVER_INFO = {
    "vllm_config": {
        "scheduler_config": {"max_num_seqs": 64, "max_num_batched_tokens": 2048,
                             "enable_chunked_prefill": True},  # fmt: skip
        "cache_config": {"block_size": 16, "enable_prefix_caching": False},
    },
    "vllm_env": {"VLLM_CPU_OMP_THREADS_BIND": "0-3", "VLLM_CPU_KVCACHE_SPACE": 4},
    "system_env": {"os": "Linux"},
}


def test_vllm_settings_from_its_dev_mode_server_info() -> None:
    assert from_server_info(SERVER_INFO) == {
        "max_num_seqs": 64, "max_num_batched_tokens": 2048, "enable_chunked_prefill": True,
        "enable_prefix_caching": False, "cpu_threads_bind": "0-3"}  # fmt: skip
    assert from_server_info({"vllm_config": "VllmConfig(...)"}) == {}  # the text format
    assert from_server_info(None) == {}


@pytest.mark.parametrize("dev_mode", [True, False])
def test_read_server_settings_asks_a_vllm_server_over_http(dev_mode: bool) -> None:
    """One bounded GET of /server_info on a real HTTP server; a 404 (no dev mode) leaves the
    settings it does not tell out, so they read "unknown" in a comparison."""
    metrics = ('vllm:cache_config_info{block_size="16",enable_prefix_caching="True",'
               'engine="0",num_gpu_blocks="100"} 1.0\n')  # fmt: skip

    async def info(request):
        if not dev_mode:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        assert request.query_params.get("config_format") == "json"
        return JSONResponse(SERVER_INFO)

    async def prom(request):
        return PlainTextResponse(metrics)

    app = Starlette(routes=[Route("/server_info", info), Route("/metrics", prom)])
    with ThreadedServer(app) as url:
        got = read_server_settings(f"{url}/metrics", {"owned_by": "vllm", "max_model_len": 512},
                                   base_url=url)  # fmt: skip
    assert got["max_model_len"] == 512 and got["num_kv_blocks"] == 100
    if dev_mode:
        assert got["max_num_seqs"] == 64 and got["cpu_threads_bind"] == "0-3"
        assert got["enable_prefix_caching"] is False  # the config, before the metric's label
    else:
        assert "max_num_seqs" not in got and got["enable_prefix_caching"] is True


def _as_vllm_without_dev_mode(run: Path, to: Path) -> Path:
    """The run as vLLM without /server_info records it: its KV settings, no batching ones."""
    import shutil

    shutil.copytree(run, to)
    meta = _meta(to)
    meta["target"]["engine"] = {"owned_by": "vllm", "root": "/ckpt", "max_model_len": 128}
    meta["target"]["server_settings"] = {"block_size": 16, "enable_prefix_caching": False}
    (to / "run.json").write_text(json.dumps(meta))
    return to


def test_settings_no_server_told_are_named_by_gate_and_report(thread_runs, tmp_path, capsys):
    """vLLM-cpu at --max-num-seqs 16 and at 4 (no dev mode): both runs' max_num_seqs is
    "unknown", so nothing differed, and gate (REGRESSION, E2E p99 +45 %) and report said
    nothing of the batch limits. They now name what neither server told, and how to get it."""
    a = _as_vllm_without_dev_mode(thread_runs[1], tmp_path / "v16")
    b = _as_vllm_without_dev_mode(thread_runs[2], tmp_path / "v4")
    policy = tmp_path / "e2e.toml"
    policy.write_text('[[rules]]\nmetric = "e2e"\nstat = "p50"\nmax_increase = 10.0\n')
    capsys.readouterr()
    rc = main(["gate", "--baseline", str(a), "--candidate", str(b), "--policy-file", str(policy)])
    out = capsys.readouterr().out
    want = ("not told by the servers, so the runs may differ there: max_num_seqs, "
            "max_num_batched_tokens, chunked prefill (vLLM serves its settings at /server_info "
            "only when started with VLLM_SERVER_DEV_MODE=1)")  # fmt: skip
    assert rc in (0, 1) and want in out, out
    md = tmp_path / "r.md"
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "r.html"),
                 "--markdown", str(md)]) == 0  # fmt: skip
    assert f"**Read with care:** {want}" in md.read_text()
    # the reference engine tells its settings: nothing to add
    rc = main(["gate", "--baseline", str(thread_runs[1]), "--candidate", str(thread_runs[2]),
               "--policy-file", str(policy)])  # fmt: skip
    assert "not told" not in capsys.readouterr().out


def test_gate_says_when_a_runs_load_generator_may_have_made_its_numbers(
    thread_runs, tmp_path, capsys
) -> None:
    """vLLM-cpu on a busy 2-core host: both runs CLIENT-BOUND (event-loop lag p99 533 and
    776 ms), timing error bounds 148 % and 187 % of TTFT p50; bench and report said so, the
    gate printed REGRESSION (TTFT p99 +60 %) and nothing of it."""
    import shutil

    busy = tmp_path / "busy"
    shutil.copytree(thread_runs[2], busy)
    meta = _meta(busy)
    meta["summary"]["client_bound"] = True
    meta["summary"]["client_bound_reason"] = "event-loop lag p99 533.2 ms"
    meta["summary"]["client"].update(timing_bound_s=0.3308, timing_bound_exceeded=True,
                                     timing_bound_reference_s=0.2232,
                                     timing_bound_judged_against="TTFT p50")  # fmt: skip
    (busy / "run.json").write_text(json.dumps(meta))
    policy = tmp_path / "e2e.toml"
    policy.write_text('[[rules]]\nmetric = "e2e"\nstat = "p50"\nmax_increase = 10.0\n')
    capsys.readouterr()
    argv = ["gate", "--baseline", str(thread_runs[1]), "--policy-file", str(policy)]
    md = tmp_path / "gate.md"
    assert main([*argv, "--candidate", str(busy), "--markdown", str(md)]) in (0, 1)
    out = capsys.readouterr().out
    line = (
        "read with care: the candidate's load generator may have made its numbers: CLIENT-BOUND "
        "(event-loop lag p99 533.2 ms); timing error bound 330.8 ms (148% of TTFT p50 223.2 ms)"
    )
    assert line in out, out
    # the PR comment too (before, --markdown had the table only: no care line)
    text = md.read_text()
    assert f"- {line}" in text and "- read with care: runs differ in cpu threads: " in text
    base = _meta(thread_runs[1])["summary"]
    flagged = base.get("client_bound") or base["client"].get("timing_bound_exceeded")
    assert ("baseline's load generator" in out) == bool(flagged)  # this host may stall it too
