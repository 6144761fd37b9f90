"""`cbbench merge` keeps what `cbbench bench` adds to a run's summary beside `summarize`'s
figures: the prefix-cache part (achieved vs intended hit rate, primed or cold) and the agent
part (sessions, makespan, tool waits, per-step TTFT), computed from the merged records with
bench's own functions (issue f1, item 3). Two real shards against the tiny engine."""

from __future__ import annotations

import json
import sys

import pytest
from cbbench.harness.cli import main
from cbbench.harness.results.agent_summary import add_cache_summaries
from cbbench.harness.results.run_folder import load_run
from cbbench.reference_engine.config.engine_config import EngineConfig
from server_support import serve

SHARED = {  # 4 groups x 4 prompts, 96 + 32 tokens: 75 % of each prompt is its group's prefix
    "shared_prefix": {
        "groups": 4, "prompts_per_group": 4, "system_len": 96, "question_len": 32,
        "output_len": 4,
    }
}  # fmt: skip
AGENT = {
    "agent": {
        "steps": {"dist": "uniform", "min": 2, "max": 3}, "system": 32, "tools": 2,
        "tool_tokens": 16, "task": 12, "call": 4, "answer": 4, "result": 12, "tool_ms": 20,
    }
}  # fmt: skip
ENGINE = EngineConfig(model="tiny", enable_prefix_caching=True, block_size=16)


def _shards(url: str, tmp_path, spec: dict, *flags: str) -> list:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    dirs = []
    for i in range(2):
        out = tmp_path / f"shard{i}"
        argv = ["bench", "--base-url", url, "--workload", str(path), "--shard", f"{i}/2",
                "--out", str(out), "--no-live", "--no-server-metrics", "--no-gpu-metrics",
                *flags]  # fmt: skip
        assert main(argv) == 0
        dirs.append(out)
    return dirs


def _merge(tmp_path, dirs, monkeypatch, capsys) -> tuple[dict, str]:
    # the shards ran one after the other, not side by side: merging them is asked for
    argv = ["merge", str(tmp_path / "merged"), *map(str, dirs), "--allow-start-skew"]
    monkeypatch.setattr(sys, "argv", ["cbbench", *argv])
    capsys.readouterr()
    assert main(argv) == 0
    return load_run(tmp_path / "merged").meta["summary"], capsys.readouterr().out


def test_merge_keeps_the_prefix_cache_summary(tmp_path, monkeypatch, capsys):
    with serve(ENGINE) as (url, _):
        dirs = _shards(url, tmp_path, SHARED, "--prime", "--concurrency", "4")
    summary, printed = _merge(tmp_path, dirs, monkeypatch, capsys)
    pc = summary["prefix_cache"]
    shards = [load_run(d).meta["summary"]["prefix_cache"] for d in dirs]
    assert pc["requests_reported"] == sum(s["requests_reported"] for s in shards) == 16
    assert pc["intended_hit_rate"] == pytest.approx(0.75) and pc["primed"]
    assert not pc["flushed"]
    assert abs(pc["hit_rate"] - 0.75) <= 0.05, pc  # primed: every group's prefix cached
    assert "prefix cache: achieved hit rate" in printed and "intended 75.0 %, primed" in printed
    again: dict = {}  # bench's own function over the merged records: the same part
    run = load_run(tmp_path / "merged")
    add_cache_summaries(again, run.records, run.meta["workload"]["source"], True)
    assert again["prefix_cache"] == pc


def test_merge_keeps_the_agent_summary(tmp_path, monkeypatch, capsys):
    with serve(ENGINE) as (url, _):
        dirs = _shards(url, tmp_path, AGENT, "--endpoint", "chat", "--num-requests", "10",
                       "--concurrency", "2")  # fmt: skip
    summary, printed = _merge(tmp_path, dirs, monkeypatch, capsys)
    ag = summary["agent"]
    shards = [load_run(d).meta["summary"]["agent"] for d in dirs]
    assert ag["steps"] == sum(s["steps"] for s in shards) == 10
    assert ag["sessions"] == sum(s["sessions"] for s in shards) >= 2  # sessions split whole
    assert ag["sessions_finished"] == sum(s["sessions_finished"] for s in shards)
    assert ag["makespan_s"]["count"] == ag["sessions_finished"] >= 1
    assert ag["tool_wait_s"]["count"] == sum(s["tool_wait_s"]["count"] for s in shards) >= 1
    assert ag["by_step"]["1"]["count"] == sum(s["by_step"]["1"]["count"] for s in shards)
    assert "agent: " in printed and "sessions finished" in printed and "makespan p50" in printed
    intended = summary["prefix_cache"]["intended_hit_rate"]
    assert intended is None and not summary["prefix_cache"]["primed"]  # not a shared-prefix run
