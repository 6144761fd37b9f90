"""`cbbench bench --repeats N` (harness/load/rigor.py, harness/conclusions/repeats.py): one
folder of N runs with the server's prefix cache reset before each, each figure's mean with a
t-interval over run means and the CV; `gate` between two repeats folders says "cannot tell"
when the configurations are not distinguishable. The fake server's speed varies run to run
(`run_jitter`, redrawn at each cache reset), so the noise between runs is known."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cbbench.harness.cli import main
from cbbench.harness.conclusions.repeats import compare, t_interval
from cbbench.harness.gate.policy import DEFAULT_POLICY
from cbbench.harness.gate.repeated import run_repeated_gate
from cbbench.harness.servers.fake_load import LoadModel
from servers.fake import Behavior, FakeServerConfig, threaded

NO_TELEMETRY = ["--no-server-metrics", "--no-gpu-metrics", "--no-live"]
TTFT = 0.05


def noisy(seed: int, scale: float = 1.0, ttft: float = TTFT) -> FakeServerConfig:
    """TTFT 50 ms x scale; 10 % between runs, 3 % between requests."""
    return FakeServerConfig(
        default=Behavior(ttft_s=ttft * scale, itl_s=0.002),
        load=LoadModel(run_jitter=0.10, jitter=0.03, seed=seed),
    )


def repeats(url: str, out: Path, n: int = 5) -> int:
    argv = ["bench", "--base-url", url, "--workload", "prompt=16,output=4", "--concurrency", "8"]
    argv += ["--num-requests", "16", "--repeats", str(n), "--out", str(out)]
    return main([*argv, *NO_TELEMETRY])


def test_t_interval_covers_the_mean_as_stated() -> None:
    rng = np.random.default_rng(0)
    hits = sum(
        (iv := t_interval(rng.normal(100, 10, 5))).low <= 100 <= iv.high for _ in range(1000)
    )
    assert 0.93 <= hits / 1000 <= 0.97  # 95 % intervals
    iv = t_interval([1.0, 2.0, 3.0])
    assert iv.mean == 2.0 and iv.cv == pytest.approx(0.5) and iv.high - 2.0 == pytest.approx(
        4.302652729911275 / 3**0.5
    )
    same = compare(rng.normal(100, 10, 5), rng.normal(102, 10, 5))
    assert same is not None and same.verdict == "cannot tell"
    apart = compare(rng.normal(100, 1, 5), rng.normal(130, 1, 5))
    assert apart is not None and apart.verdict == "higher" and apart.low > 0


def test_repeats_write_one_folder_with_intervals_and_reset_the_cache(tmp_path: Path) -> None:
    out = tmp_path / "rep"
    with threaded(noisy(seed=3)) as srv:
        assert repeats(srv.url, out, n=3) == 0
        assert srv.server.cache_resets == 3  # before each repeat
    index = json.loads((out / "repeats.json").read_text())
    assert index["runs"] == ["repeat-1", "repeat-2", "repeat-3"]
    assert index["reset"] == ["/reset_prefix_cache"] * 3
    assert "t-interval over the run means" in index["method"]
    iv = index["aggregate"]["ttft_p50"]
    per_run = [
        json.loads((out / r / "run.json").read_text())["summary"] for r in index["runs"]
    ]
    lead = [(s.get("window_figures") or s)["ttft_s"]["p50"] for s in per_run]
    assert iv["values"] == pytest.approx(lead) and iv["mean"] == pytest.approx(np.mean(lead))
    assert iv["low"] < iv["mean"] < iv["high"] and iv["cv"] > 0


def test_gate_cannot_tell_two_configurations_2_percent_apart_on_a_10_percent_noisy_server(
    tmp_path: Path, capsys
) -> None:
    with threaded(noisy(seed=11)) as srv:
        assert repeats(srv.url, tmp_path / "a") == 0
    with threaded(noisy(seed=12, scale=1.02)) as srv:
        assert repeats(srv.url, tmp_path / "b") == 0
    capsys.readouterr()
    code = main(["gate", "--baseline", str(tmp_path / "a"), "--candidate", str(tmp_path / "b")])
    text = capsys.readouterr().out
    assert code == 0  # no regression claimed
    assert "CANNOT TELL" in text and "REGRESSION" not in text
    assert "Welch t-interval over run means" in text
    gate = run_repeated_gate(str(tmp_path / "a"), str(tmp_path / "b"), DEFAULT_POLICY)
    ttft = [r for r in gate.results if r.rule.metric == "ttft"]
    assert ttft and all(r.verdict == "cannot tell" for r in ttft), [r.note for r in ttft]
    assert all("cannot be told apart" in r.note for r in ttft)
    md = tmp_path / "report.md"  # the report reads the repeats folders the same way
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--no-html",
                 "--markdown", str(md)]) == 0  # fmt: skip
    text = md.read_text()
    assert "5 repeats" in text and "ttft_p50" in text and "cannot tell apart" in text


@pytest.mark.slow  # 10 trials x 5 repeats (~50 runs)
def test_intervals_of_5_repeats_cover_the_true_mean_in_9_of_10_seeded_trials(tmp_path: Path) -> None:
    covered, ttft = 0, 0.2  # long enough that the client's own ~1 ms is no bias
    for trial in range(10):
        with threaded(noisy(seed=100 + trial, ttft=ttft)) as srv:
            assert repeats(srv.url, tmp_path / f"t{trial}") == 0
        index = json.loads((tmp_path / f"t{trial}" / "repeats.json").read_text())
        iv = index["aggregate"]["ttft_mean"]
        covered += iv["low"] <= ttft <= iv["high"]  # the server's mean TTFT: E[speed] = 1
    assert covered >= 9


def test_interval_of_a_figure_that_cannot_be_negative_stops_at_zero() -> None:
    # three noisy repeats of a p99 TTFT (ms): mean 21.3, t(0.975, 2) * s / sqrt(3) = 27
    iv = t_interval([0.0078, 0.0214, 0.0346])
    assert iv is not None and iv.low == 0.0 and iv.high > iv.mean
    signed = t_interval([-1.0, 0.5, 2.0])  # a signed quantity keeps its interval
    assert signed is not None and signed.low < -1.0


def test_relative_change_of_a_figure_that_cannot_be_negative_stops_at_minus_100_percent() -> None:
    # p50 TTFT of two 3-repeat folders on a noisy host: the gate printed [-103.1%, +113.2%]
    d = compare([0.0040, 0.0118, 0.0095], [0.0098, 0.0076, 0.0091], "ttft_p50")
    assert d is not None and d.low == -1.0 and d.verdict == "cannot tell"


def test_gate_between_repeats_of_a_zero_baseline_is_cannot_tell_not_a_ratio() -> None:
    """Repeats whose TPOT p50 was 0 in every baseline run: no ratio, 'cannot tell' (a
    nan ratio was compared with the limit before and read as a verdict)."""
    from cbbench.harness.gate.policy import DEFAULT_POLICY, Rule
    from cbbench.harness.gate.repeated import judge_repeated

    rule = Rule("tpot", "max_increase", 0.10, "p50")
    base = [{"summary": {"tpot_s": {"p50": 0.0}}} for _ in range(3)]
    cand = [{"summary": {"tpot_s": {"p50": v}}} for v in (0.010, 0.011, 0.012)]
    res = judge_repeated(rule, base, cand, DEFAULT_POLICY)
    assert res.verdict == "cannot tell" and "is 0" in res.note
    same = judge_repeated(rule, base, base, DEFAULT_POLICY)
    assert same.verdict == "pass"
