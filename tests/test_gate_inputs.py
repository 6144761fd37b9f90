"""Unusable or mismatched gate inputs exit 2 with one clear line; policies parse from TOML."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cbbench.harness.cli import main
from cbbench.harness.gate.policy import DEFAULT_POLICY, load_policy
from report_synth import write_run


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("gi") / "base", n=60, seed=1, max_output=8)


def gate_error(capsys, *argv: str) -> str:
    assert main(["gate", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("cbbench gate: error: ")
    return err


def test_missing_and_malformed_runs(base: Path, tmp_path: Path, capsys) -> None:
    err = gate_error(capsys, "--baseline", str(tmp_path / "nope"), "--candidate", str(base))
    assert "nope" in err and "no such directory" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no requests.jsonl" in gate_error(
        capsys, "--baseline", str(base), "--candidate", str(empty)
    )
    torn = write_run(tmp_path / "torn", n=30, seed=1, max_output=8)
    lines = (torn / "requests.jsonl").read_text().splitlines()
    lines[3] = lines[3][:25]  # a broken line in the middle is an error (a torn last line is not)
    (torn / "requests.jsonl").write_text("\n".join(lines) + "\n")
    err = gate_error(capsys, "--baseline", str(base), "--candidate", str(torn))
    assert "requests.jsonl:4: not valid JSON" in err
    badmeta = write_run(tmp_path / "badmeta", n=30, seed=1, max_output=8)
    (badmeta / "run.json").write_text("{not json")
    assert "run.json: not valid JSON" in gate_error(
        capsys, "--baseline", str(badmeta), "--candidate", str(base)
    )


def test_mismatched_runs(base: Path, tmp_path: Path, capsys) -> None:
    other_seed = write_run(tmp_path / "seed", n=60, seed=1, workload_seed=8, max_output=8)
    err = gate_error(capsys, "--baseline", str(base), "--candidate", str(other_seed))
    assert "not comparable: workload seed: baseline 7, candidate 8" in err
    other_wl = write_run(tmp_path / "wl", n=60, seed=1, workload="long-docs", max_output=8)
    err = gate_error(capsys, "--baseline", str(base), "--candidate", str(other_wl))
    assert "not comparable: workload: baseline" in err and "candidate long-docs" in err
    sim = write_run(tmp_path / "sim", n=60, seed=1, meta={"simulated": True}, max_output=8)
    assert "measured or simulated: baseline measured, candidate simulated" in gate_error(
        capsys, "--baseline", str(base), "--candidate", str(sim)
    )
    few = write_run(tmp_path / "few", n=60, seed=1, errors=50, max_output=8)
    err = gate_error(capsys, "--baseline", str(base), "--candidate", str(few))
    assert "candidate has 10 successful requests, the policy needs at least 20" in err


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("rules = [", "not valid TOML"),
        ("confidence = 0.9\n", "needs at least one [[rules]] table"),
        ('[[rules]]\nmetric = "latency"\nmax = 1\n', "metric must be one of"),
        (
            '[[rules]]\nmetric = "ttft"\nstat = "p99"\nmax_increase = 0.1\nmax = 2\n',
            "exactly one of",
        ),
        ('[[rules]]\nmetric = "ttft"\nstat = "median"\nmax = 2\n', "stat must be mean or pNN"),
        ('[[rules]]\nmetric = "error_rate"\nmax_increase = 0.1\n', "error_rate takes only"),
        ('[[rules]]\nmetric = "ttft"\nmax_increase = "10%"\n', "max_increase must be a number"),
        ('seed = -1\n[[rules]]\nmetric = "ttft"\nmax = 1\n', "seed must be an integer >= 0"),
        ('[[rules]]\nmetric = "ttft"\nmax = 1\nthreshold = 2\n', "unknown key(s) threshold"),
    ],
)
def test_bad_policies(base: Path, tmp_path: Path, capsys, toml: str, message: str) -> None:
    policy = tmp_path / "gate.toml"
    policy.write_text(toml)
    err = gate_error(
        capsys, "--baseline", str(base), "--candidate", str(base), "--policy-file", str(policy)
    )
    assert str(policy) in err and message in err


def test_policy_file_round_trip(base: Path, tmp_path: Path, capsys) -> None:
    policy = tmp_path / "gate.toml"
    policy.write_text(
        "confidence = 0.9\nresamples = 300\nseed = 3\nmin_requests = 10\n"
        '[[rules]]\nmetric = "ttft"\nstat = "p99.9"\nmax_increase = 0.25\n'
        '[[rules]]\nmetric = "request_throughput"\nmax_decrease = 0.1\n'
        '[[rules]]\nmetric = "tpot"\nmax = 0.5\n'
    )
    p = load_policy(policy)
    assert (p.confidence, p.resamples, p.seed, p.min_requests) == (0.9, 300, 3, 10)
    assert [r.title for r in p.rules] == [
        "p99.9 TTFT must not rise > 25%",
        "requests/s must not fall > 10%",
        "mean TPOT must stay <= 0.5",
    ]
    assert p.rules[0].quantile == pytest.approx(0.999)
    md = tmp_path / "gate.md"
    args = ["gate", "--baseline", str(base), "--candidate", str(base), "--policy-file", str(policy)]
    assert main([*args, "--markdown", str(md)]) == 0
    out = capsys.readouterr().out
    # p99.9 TTFT over a small run could not fail (r51 finding 14): inconclusive, never PASS
    assert "90% CI" in out and "CANNOT TELL (inconclusive)" in out and "PASS" not in out
    assert "too few for p99.9" in out
    assert md.read_text().startswith("### cbbench gate: CANNOT TELL")
    assert main([*args, "--fail-on-cannot-tell"]) == 3  # a CI job that must not merge on it
    assert len(DEFAULT_POLICY.rules) == 7


def test_metric_missing_in_both_runs_is_not_applicable(base: Path, tmp_path: Path) -> None:
    # no server-reported queue times in either run: the rule is skipped, not failed
    runs = []
    for name in ("a", "b"):
        d = write_run(tmp_path / name, n=40, seed=1, max_output=8)
        rows = [json.loads(x) for x in (d / "requests.jsonl").read_text().splitlines()]
        (d / "requests.jsonl").write_text(
            "".join(json.dumps({**r, "server_queue_s": None}) + "\n" for r in rows)
        )
        runs.append(d)
    policy = tmp_path / "q.toml"
    policy.write_text('[[rules]]\nmetric = "queue"\nstat = "p99"\nmax_increase = 0.1\n')
    junit = tmp_path / "q.xml"
    argv = ["gate", "--baseline", str(runs[0]), "--candidate", str(runs[1])]
    assert main([*argv, "--policy-file", str(policy), "--junit", str(junit)]) == 0
    assert 'skipped="1"' in junit.read_text()
