"""`cbbench bench --scenario mlperf-server` (harness/conclusions/mlperf.py, MLPerf Inference's
server scenario): VALID against a fake server well inside Llama3.1-8B's limits, INVALID with
the early-stopping reason against one whose p99 TPOT is just over; the early-stopping
arithmetic against its closed form; the limits as the rules give them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from cbbench.harness.cli import main
from cbbench.harness.conclusions import mlperf
from cbbench.harness.conclusions.stats import betainc
from servers.fake import Behavior, FakeServerConfig, threaded

NO_TELEMETRY = ["--no-server-metrics", "--no-gpu-metrics", "--no-live"]


def scenario(url: str, out: Path, *extra: str) -> int:
    argv = ["bench", "--base-url", url, "--workload", "prompt=16,output=4", "--rate", "150"]
    argv += ["--scenario", "mlperf-server", "--model-class", "llama3.1-8b"]
    argv += ["--min-duration", "3.2s", "--out", str(out), *extra]
    return main([*argv, *NO_TELEMETRY])


def test_early_stopping_matches_its_closed_form_and_the_limits_the_rules() -> None:
    # no query over the limit: h with 0.99^h <= 0.01, i.e. ceil(ln 0.01 / ln 0.99) = 459
    assert mlperf.min_passing(0) == math.ceil(math.log(0.01) / math.log(0.99)) == 459
    hs = [mlperf.min_passing(t) for t in range(6)]
    assert hs == sorted(hs) and len(set(hs)) == 6  # each query over the limit costs more
    for t in (1, 5):  # the least h: the criterion holds at h, not at h - 1
        h = mlperf.min_passing(t)
        assert betainc(h, t + 1, 0.99) <= 0.01 < betainc(h - 1, t + 1, 0.99)
    assert mlperf.limits("llama3.1-8b", "mlperf-server") == (2.0, 0.100)
    assert mlperf.limits("llama3.1-8b", "mlperf-interactive") == (0.500, 0.030)
    assert mlperf.limits("llama2-70b", "mlperf-interactive") == (0.450, 0.040)
    with pytest.raises(Exception, match="no interactive limits"):
        mlperf.limits("mixtral-8x7b", "mlperf-interactive")
    assert mlperf.rank_percentile(list(range(100))) == 99  # LoadGen: sorted[int(n x 0.99)]


def test_valid_inside_the_limits_and_the_length_said_not_compliant(tmp_path: Path, capsys) -> None:
    cfg = FakeServerConfig(default=Behavior(ttft_s=0.01, itl_s=0.02))  # TPOT 20 ms << 100 ms
    with threaded(cfg) as srv:
        assert scenario(srv.url, tmp_path / "ok") == 0
    text = capsys.readouterr().out
    assert "MLPerf mlperf-server (llama3.1-8b): VALID" in text
    assert "length NOT COMPLIANT: --min-duration 3.2 s, the rules require 600 s" in text
    verdict = json.loads((tmp_path / "ok" / "run.json").read_text())["summary"]["mlperf"]
    assert verdict["valid"] and verdict["queries"] >= 459 and verdict["duration_s"] >= 3.2
    assert verdict["rules"].startswith("inference_rules.adoc")


def test_invalid_when_p99_tpot_is_just_over_with_the_early_stopping_reason(
    tmp_path: Path, capsys
) -> None:
    slow = Behavior(ttft_s=0.01, itl_s=0.104)  # 4 % of the queries: TPOT 104 ms > 100 ms
    rules = {i: slow for i in range(0, 5000, 25)}
    with threaded(FakeServerConfig(default=Behavior(ttft_s=0.01, itl_s=0.02), rules=rules)) as srv:
        assert scenario(srv.url, tmp_path / "slow") == mlperf.EXIT_INVALID
    text = capsys.readouterr().out
    assert "MLPerf mlperf-server (llama3.1-8b): INVALID" in text
    assert "early stopping (TPOT)" in text and "more, every one under the limit" in text
    verdict = json.loads((tmp_path / "slow" / "run.json").read_text())["summary"]["mlperf"]
    tpot = next(c for c in verdict["checks"] if c["metric"] == "TPOT")
    assert 0.100 < tpot["p99_s"] < 0.150 and not tpot["early_stopping_ok"]  # 104 ms + client
    ttft = next(c for c in verdict["checks"] if c["metric"] == "TTFT")
    assert ttft["early_stopping_ok"]


def test_scenario_flags_are_checked(tmp_path: Path, capsys) -> None:
    with threaded(FakeServerConfig()) as srv:
        base = ["bench", "--base-url", srv.url, "--workload", "prompt=16,output=4"]
        assert main([*base, "--scenario", "mlperf-server", "--model-class", "llama3.1-8b"]) == 2
        assert "give --rate" in capsys.readouterr().err
        assert main([*base, "--rate", "5", "--model-class", "llama3.1-8b"]) == 2
        assert "go with --scenario" in capsys.readouterr().err
