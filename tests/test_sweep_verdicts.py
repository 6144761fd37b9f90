"""Sweep verdicts (issue 42, finding 5): a short level at a high rate is not called
unsustained because of its drain time; a level too short to judge says so and how many
requests it needs; the table is the command's output, on stdout."""

from __future__ import annotations

import json
from pathlib import Path

from cbbench.harness.cli import main
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.sweep.verdict import judge_level
from servers.fake import Behavior, FakeServerConfig, threaded

# an idle server: every request takes 0.4 s, whatever the load
IDLE = Behavior(ttft_s=0.4, itl_s=0.0, tokens_per_chunk=4096)
FLAGS = ["--workload", "uniform", "--no-live", "--no-server-metrics", "--no-gpu-metrics"]


def _sweep(url: str, out: Path, rates: str, n: int) -> dict:
    argv = ["sweep", "--base-url", url, "--rates", rates, "--num-requests", str(n)]
    assert main([*argv, "--out", str(out), *FLAGS]) == 0
    return json.loads((out / "sweep.json").read_text())


def test_short_fast_level_on_an_idle_server_is_too_short_not_unsustained(tmp_path, capsys):
    with threaded(FakeServerConfig(default=IDLE)) as srv:
        index = _sweep(srv.url, tmp_path / "s", "8,32", 30)
        printed = capsys.readouterr().out
        lv8, lv32 = index["levels"]
        assert lv8["verdict"]["sustained"] is True
        v = lv32["verdict"]
        # the old verdict: 30 requests / (arrival 0.9 s + 0.4 s drain) < 0.9 x 32 -> "not kept up"
        assert lv32["request_throughput"] < 0.9 * 32
        assert v["sustained"] is None and v["too_short"].startswith("too short to judge")
        assert 35 <= v["needed_requests"] <= 60  # 3 x 32/s x 0.4 s + 1
        assert f"needs --num-requests {v['needed_requests']} or more" in v["too_short"]
        assert index["saturation"]["too_short"] == ["rate-32"]
        assert "| rate 32/s |" in printed and "too short to judge" in printed  # stdout
        assert "highest sustained rate 8 req/s" in printed
        assert "(higher levels too short to judge)" in printed
        # given the requests it asked for, the same level is judged, and sustained
        index = _sweep(srv.url, tmp_path / "t", "32", v["needed_requests"])
    assert index["levels"][0]["verdict"]["sustained"] is True
    assert index["saturation"]["max_sustained_rate"] == 32
    assert "highest sustained rate 32 req/s" in capsys.readouterr().out


def _rec(i: int, sent: float, end: float) -> RequestRecord:
    return RequestRecord(id=f"r{i}", index=i, prompt_len=1, output_len=1, sent_s=sent,
                         end_s=end, e2e_s=end - sent)  # fmt: skip


def test_a_backlog_is_not_sustained():
    # 100 requests offered at 32/s to a server that serves one at a time, 0.1 s each (10/s)
    recs, free = [], 0.0
    for i in range(100):
        sent = i / 32
        free = max(sent, free) + 0.1
        recs.append(_rec(i, sent, free))
    v = judge_level(recs, 32.0)
    assert v.too_short is None and v.sustained is False
    assert 9 < v.achieved_rps < 12 and 31 < v.sent_rps < 33


def test_a_server_that_keeps_up_is_sustained_and_few_requests_are_too_short():
    recs = [_rec(i, i / 32, i / 32 + 0.3) for i in range(60)]
    v = judge_level(recs, 32.0)
    assert v.sustained is True and abs(v.achieved_rps - v.sent_rps) < 0.5
    v = judge_level(recs[:10], 32.0)
    assert v.sustained is None and "10 completed requests" in v.too_short


def test_a_long_request_finishing_last_is_not_a_backlog():
    # mixed lengths at 8/s on a server that keeps up: 50 ms to the first token, 10 ms a token;
    # the last request sent asks for 1,000 tokens and ends 10 s after the last send
    recs = []
    for i in range(40):
        out = 1000 if i == 39 else 20 + 37 * i % 300
        sent, ttft = i / 8, 0.05
        end = sent + ttft + (out - 1) * 0.01
        r = _rec(i, sent, end)
        r.ttft_s, r.tpot_s, r.output_tokens_server = ttft, 0.01, out
        recs.append(r)
    v = judge_level(recs, 8.0)
    assert v.sustained is True, v
    # the same level where the server fell behind: each request waits 0.1 s more than the last
    for i, r in enumerate(recs):
        r.end_s += 0.1 * i
        r.ttft_s += 0.1 * i
    assert judge_level(recs, 8.0).sustained is False
