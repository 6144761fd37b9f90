"""Reasoning streams timed right, against two servers that say when they sent each token:
cbbench's own fake server (in its own process) and an independent one written for this test
(`reasoning_server.py`: no token ids, its own pacing and JSON). 32 reasoning then 32 answer
tokens, 10 ms apart, the first at 50 ms: TTFT p50 and TTFO p50 within 1 ms of the server's log
(2 ms for the independent server's user-space arrival stamps),
TPOT within 5 % of the server's, 32 reasoning and 64 output tokens on every record. Then the
same through `cbbench bench`, which reports TTFO."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cbbench.harness.diagnose import diagnose_run
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.results.run_folder import load_run
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console
from servers.fake import Behavior, FakeServerConfig, process

from tests.process_support import readline_within

# serial (TTFT/TTFO within 1-2 ms of the servers' logs): the README's command
# runs it after the parallel phase, alone
pytestmark = pytest.mark.serial

N = 12
# The fake server stamps a request's arrival with the kernel's receive time, the independent
# one when its event loop has read it: on a loaded host that user-space stamp may be late by a
# millisecond or more, so the independent server's check allows 2 ms (a misread stream is off
# by tens or hundreds: the bug this guards against put TTFT 321 ms late)
FAKE_MS, INDEPENDENT_MS = 1.0, 2.0
SERVER = Path(__file__).with_name("reasoning_server.py")
CLI = [sys.executable, "-m", "cbbench.harness.cli"]


def _wl() -> Workload:
    return Workload("reasoning-test", 0, tuple(RequestSpec(i, 8, 64, None) for i in range(N)))


def _bench(url: str, tmp_path: Path, **kw):
    cfg = BenchConfig(
        base_url=url,
        workload=_wl(),
        endpoint="chat",
        concurrency=2,
        out_dir=tmp_path / "run",
        live=False,
        **kw,
    )
    return run_bench(cfg, console=Console(file=io.StringIO()))


def _check(
    records, truth: dict[str, tuple[float, float, float]], limit_ms: float
) -> dict[str, float]:
    """Client vs server log: {metric: |p50 difference|}, after the per-record counts."""
    assert len(records) == N and all(r.ok for r in records), [r.error for r in records]
    for r in records:
        assert r.reasoning_tokens == 32 and r.stream_flags == []
        assert r.output_tokens_client == 64 and (r.output_tokens_server or 64) == 64
    by_id = {r.id: r for r in records}
    ours = np.array([[by_id[i].ttft_s, by_id[i].ttfo_s, by_id[i].tpot_s] for i in truth])
    theirs = np.array([truth[i] for i in truth])
    p50_ours, p50_theirs = np.median(ours, axis=0), np.median(theirs, axis=0)
    diff = {
        "ttft_ms": abs(p50_ours[0] - p50_theirs[0]) * 1e3,
        "ttfo_ms": abs(p50_ours[1] - p50_theirs[1]) * 1e3,
        "tpot_rel": abs(p50_ours[2] / p50_theirs[2] - 1),
    }
    print(f"p50 client {p50_ours}, server log {p50_theirs}, |diff| {diff}")
    assert p50_theirs[0] == pytest.approx(0.05, abs=0.01)  # the server kept its schedule
    assert p50_theirs[1] == pytest.approx(0.37, abs=0.02)
    assert diff["ttft_ms"] < limit_ms and diff["ttfo_ms"] < limit_ms, diff
    assert diff["tpot_rel"] < 0.05 and abs(p50_ours[2] / 0.01 - 1) < 0.05, (diff, p50_ours)
    return diff


# the three fields each stay in the default run through the independent server below; of the
# fake server's, `reasoning_content` stays and the other two are behind `slow` (suite budget)
@pytest.mark.parametrize(
    "field",
    [
        pytest.param("reasoning", marks=pytest.mark.slow),
        "reasoning_content",
        pytest.param("think-tags", marks=pytest.mark.slow),
    ],
)
def test_fake_server_reasoning_timed_against_its_log(tmp_path, field):
    b = Behavior(ttft_s=0.05, itl_s=0.01, reasoning_tokens=32, reasoning_field=field)
    with process(FakeServerConfig(b)) as srv:
        res = _bench(srv.url, tmp_path, collect_server_times=True)
    truth = {}
    for r in res.records:
        sends, recv = r.extra["server_send_ns"], r.extra["t_recv_ns"]
        assert len(sends) == 64
        truth[r.id] = (
            (sends[0] - recv) / 1e9,
            (sends[32] - recv) / 1e9,
            (sends[-1] - sends[0]) / 63e9,
        )
    _check(res.records, truth, FAKE_MS)
    s = res.summary
    assert s["total_reasoning_tokens"] == 32 * N and s["reasoning_share"] == pytest.approx(0.5)
    assert s["ttfo_s"]["count"] == N and s["ttfo_s"]["p50"] > s["ttft_s"]["p50"] + 0.3
    # cbbench diagnose: the answer's wait is the reasoning's, with each engine's lever
    found = {f.rule: f for f in diagnose_run(load_run(res.run_dir)).findings}
    assert "reasoning-wait" in found and "enable_thinking" in found["reasoning-wait"].fixes["vllm"]
    assert found["reasoning-wait"].values["reasoning_share_of_output"] == pytest.approx(0.5)


def test_no_reasoning_no_ttfo_gap_no_finding(tmp_path):
    with process(FakeServerConfig(Behavior(ttft_s=0.05, itl_s=0.01))) as srv:
        res = _bench(srv.url, tmp_path)
    assert all(r.ok and r.ttfo_s == r.ttft_s and r.reasoning_tokens == 0 for r in res.records)
    assert all(r.answer_tpot_s == r.tpot_s for r in res.records)
    assert res.summary["total_reasoning_tokens"] == 0
    assert "reasoning-wait" not in {f.rule for f in diagnose_run(load_run(res.run_dir)).findings}


def _mini_server(field: str):
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--field", field], stdout=subprocess.PIPE, text=True
    )
    line = readline_within(proc, 60, "the test server")
    assert line.startswith("PORT "), line
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


def _mini_log(proc) -> dict[str, tuple[float, float, float]]:
    proc.terminate()
    out, _ = proc.communicate(timeout=20)
    truth = {}
    for line in out.splitlines():
        e = json.loads(line)
        s, recv = e["send_ns"], e["recv_ns"]
        truth[e["id"]] = ((s[0] - recv) / 1e9, (s[32] - recv) / 1e9, (s[-1] - s[0]) / 63e9)
    return truth


@pytest.mark.parametrize(
    ("field", "parser"),
    [("reasoning", "auto"), ("reasoning_content", "auto"), ("think-tags", "think-tags")],
)
def test_independent_server_reasoning_timed_against_its_log(tmp_path, field, parser):
    proc, url = _mini_server(field)
    try:
        res = _bench(url, tmp_path, extensions=False, reasoning_parser=parser)
    finally:
        truth = _mini_log(proc)
    assert len(truth) == N
    _check(res.records, truth, INDEPENDENT_MS)


def test_cbbench_bench_reports_ttfo(tmp_path):
    proc, url = _mini_server("reasoning_content")
    try:
        out = subprocess.run(
            [*CLI, "bench", "--base-url", url, "--endpoint", "chat", "--workload", "seed-demo",
             "--num-requests", "4", "--no-extensions", "--out", str(tmp_path / "r"), "--no-live",
             "--slo", "ttfo=1s", "--no-server-metrics", "--no-gpu-metrics"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        _mini_log(proc)
    assert out.returncode == 0, out.stderr
    assert "TTFO (ms)" in out.stdout and "answer TPOT (ms)" in out.stdout
    assert "reasoning: 128 tokens, 50.0% of output" in out.stdout
    assert "100.0% within SLO" in out.stdout
    recs = [json.loads(x) for x in (tmp_path / "r" / "requests.jsonl").read_text().splitlines()]
    assert [r["reasoning_tokens"] for r in recs] == [32] * 4
    assert all(r["ttfo_s"] > r["ttft_s"] + 0.3 for r in recs)
