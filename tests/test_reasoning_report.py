"""TTFO where a metric goes after the run: the gate (TTFO gated like TTFT), export columns,
the live view, the sweep table and the report's table, on synthetic run folders."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from cbbench.harness.cli import main
from cbbench.harness.console.live import LiveStats
from cbbench.harness.gate.judge import run_gate
from cbbench.harness.gate.policy import DEFAULT_POLICY
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.run_folder import load_run
from cbbench.harness.sweep.runner import print_sweep
from report_synth import write_run


def _reasoning_run(path: Path, think_s: float) -> Path:
    """A synthetic run whose requests each reasoned `think_s` (half their tokens)."""
    write_run(path, n=60)
    lines = (path / "requests.jsonl").read_text().splitlines()
    out = []
    for line in lines:
        r = json.loads(line)
        if r.get("status") == "ok" and r.get("ttft_s") is not None:
            r["ttfo_s"] = r["ttft_s"] + think_s
            r["reasoning_s"] = think_s
            r["reasoning_tokens"] = r["output_tokens_server"] // 2
        out.append(json.dumps(r))
    (path / "requests.jsonl").write_text("\n".join(out) + "\n")
    return path


def test_gate_gives_each_ttft_rule_a_ttfo_twin_when_a_run_reasoned(tmp_path):
    base = load_run(_reasoning_run(tmp_path / "base", 0.3))
    same = run_gate(base, load_run(_reasoning_run(tmp_path / "same", 0.3)), DEFAULT_POLICY)
    ttfo = [r for r in same.results if r.rule.metric == "ttfo"]
    n_ttft = sum(r.metric == "ttft" for r in DEFAULT_POLICY.rules)
    # identical runs: every TTFO rule passes, or (a p99 of a few dozen requests) cannot tell
    assert len(ttfo) == n_ttft and all(r.verdict in ("pass", "cannot tell") for r in ttfo)
    assert sum(r.verdict == "pass" for r in ttfo) >= 1 and same.passed
    slow = run_gate(base, load_run(_reasoning_run(tmp_path / "slow", 0.9)), DEFAULT_POLICY)
    verdicts = {(r.rule.metric, r.rule.stat): r.verdict for r in slow.results}
    assert verdicts[("ttft", "p50")] in ("pass", "cannot tell")  # unchanged (60 requests)
    assert verdicts[("ttfo", "p50")] == "fail"
    assert not slow.passed
    # runs that did not reason: no TTFO rules added
    plain = run_gate(
        load_run(write_run(tmp_path / "p1", n=60)),
        load_run(write_run(tmp_path / "p2", n=60)),
        DEFAULT_POLICY,
    )
    assert not any(r.rule.metric == "ttfo" for r in plain.results)


def test_export_csv_has_the_reasoning_columns(tmp_path):
    run = _reasoning_run(tmp_path / "run", 0.3)
    assert main(["export", str(run), "--csv", str(tmp_path / "r.csv")]) == 0
    df = pd.read_csv(tmp_path / "r.csv")
    for col in ("ttfo_s", "reasoning_tokens", "reasoning_s", "answer_tpot_s", "stream_flags"):
        assert col in df.columns
    ok = df[df.status == "ok"]
    assert (ok.ttfo_s - ok.ttft_s).round(6).eq(0.3).all()


def test_report_table_and_cdf_show_ttfo_only_for_reasoning_runs(tmp_path):
    html = tmp_path / "r.html"
    assert main(["report", str(_reasoning_run(tmp_path / "a", 0.3)), "--out", str(html)]) == 0
    page = html.read_text()
    assert "CDF of TTFO" in page and "TTFO p50" in page and "reasoning share" in page
    md = tmp_path / "r.md"
    assert main(["report", str(tmp_path / "a"), "--markdown", str(md), "--no-html"]) == 0
    assert "TTFO p50" in md.read_text()
    assert main(["report", str(write_run(tmp_path / "b", n=60)), "--out", str(html)]) == 0
    page = html.read_text()
    assert "TTFO" not in page and "reasoning share" not in page
    assert main(["report", str(tmp_path / "b"), "--markdown", str(md), "--no-html"]) == 0
    assert "TTFO" not in md.read_text()


def test_live_view_shows_ttfo_once_a_request_reasoned():
    live = LiveStats(2)
    live.on_record(RequestRecord("a", 0, 1, 2, ttft_s=0.05, ttfo_s=0.05, reasoning_tokens=0))
    assert "TTFO" not in str([c._cells for c in live.render().columns])
    live.on_record(RequestRecord("b", 1, 1, 2, ttft_s=0.05, ttfo_s=0.4, reasoning_tokens=8))
    cells = [c._cells for c in live.render().columns]
    assert "TTFO p50/p99" in cells[0]


def test_sweep_table_has_ttfo_columns_when_a_level_reasoned(tmp_path, capsys):
    level = {
        "load": "rate 1", "request_throughput": 1.0, "output_throughput": 10.0,
        "ttft_p50_s": 0.05, "ttft_p99_s": 0.06, "ttfo_p50_s": 0.4, "ttfo_p99_s": 0.5,
        "reasoning_tokens": 100, "stopped_early": None,
    }  # fmt: skip
    index = {"mode": "rates", "status": "done", "levels": [level],
             "saturation": {"max_sustained_rate": None}}  # fmt: skip
    path = print_sweep(index, tmp_path)
    text = Path(path).read_text()
    assert "TTFO p50 (ms)" in text and "400.0" in text


def test_summary_counts_flags_and_ttfo_goodput():
    from cbbench.harness.console.live import _caption
    from cbbench.harness.results.summary import parse_slo, summarize

    def rec(i, ttfo, flags=(), reasoning=8):
        return RequestRecord(
            f"r{i}", i, 4, 16, sent_s=0.0, first_token_s=0.05, last_token_s=0.5, end_s=0.5,
            ttft_s=0.05, ttfo_s=ttfo, e2e_s=0.5, tpot_s=0.03, output_tokens_server=16,
            reasoning_tokens=reasoning, stream_flags=list(flags),
        )  # fmt: skip

    recs = [rec(0, 0.2), rec(1, 0.9), rec(2, None, ["unclosed_think"], 16)]
    s = summarize(recs, 1.0, parse_slo("ttft=100ms,ttfo=500ms"))
    assert s["goodput"]["requests"] == 1  # TTFO 0.9 s misses; a stream that never answered too
    assert s["stream_flags"] == {"unclosed_think": 1} and s["total_reasoning_tokens"] == 32
    assert s["reasoning_share"] == 32 / 48 and s["ttfo_s"]["count"] == 2
    caption = _caption(s, s["counts"])
    assert "warning: streams flagged by the reasoning classifier: unclosed_think 1" in caption
    assert "reasoning: 32 tokens, 66.7% of output" in caption
