"""`cbbench run` with speculative decoding: plain continuous batching and "continuous+spec"
(a real `cbbench serve` each, load over HTTP, telemetry on) side by side on one workload;
the speculative server's acceptance comes back through its /metrics."""

from __future__ import annotations

import pytest
from cbbench.harness.cli import main
from cbbench.harness.results.run_folder import load_run


def test_run_compares_with_and_without_speculation(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    out = tmp_path / "spec"
    argv = ["run", "--workload", "seed-demo", "--num-requests", "4", "--batch-size", "2"]
    argv += ["--schedulers", "continuous", "--device", "cpu", "--no-live", "--temperature", "0"]
    argv += ["--speculative-method", "draft", "--speculative-model", "tiny"]
    assert main([*argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "output tok/s vs continuous" in text and "spec: draft acceptance" in text
    plain, spec = load_run(out / "continuous"), load_run(out / "continuous+spec")
    for run in (plain, spec):
        assert run.meta["status"] == "complete"
        measured = [r for r in run.records if not r.warmup]  # run warms each server once
        assert len(measured) == 4 and all(r.ok for r in run.records)
        assert len(run.records) - len(measured) == 1
    assert "--speculative-method" in spec.meta["load"]["engine_flags"]
    assert "--speculative-method" not in plain.meta["load"]["engine_flags"]
    server = spec.meta["summary"]["telemetry"]["server"]
    assert server["spec_acceptance_rate"] == 1.0  # greedy, the target as its own draft
    assert server["spec_mean_accepted_length"] > 1
    assert "spec_acceptance_rate" not in plain.meta["summary"]["telemetry"]["server"]
    for r in (r for r in spec.records if not r.warmup):  # several tokens per SSE chunk: one ITL per token, mean = TPOT
        assert r.extra["num_accepted_tokens"] == r.extra["num_draft_tokens"] > 0
        assert len(r.itl_s) == r.output_tokens_client - 1 == r.output_len - 1
        assert sum(r.itl_s) / len(r.itl_s) == pytest.approx(r.tpot_s)
    assert (out / "report.html").exists()
    assert "spec acceptance" in (out / "report.html").read_text()


def test_run_spec_without_continuous_is_one_line(tmp_path, capsys):
    argv = ["run", "--schedulers", "static", "--speculative-method", "ngram"]
    assert main([*argv, "--out", str(tmp_path / "x"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "continuous scheduler only" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()
