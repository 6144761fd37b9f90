"""`cbbench calibrate --from-run`: the black-box fit (reference_engine/sim/run_fit.py) on runs
of a server whose step model is known (the simulator with chosen coefficients: the fit must
find them back from per-request times alone), the run-folder path and the CLI."""

from __future__ import annotations

import json
import random

import pytest
from cbbench.harness.cli import main
from cbbench.harness.errors import CbbenchError
from cbbench.harness.planning.calibration import parse_server_config
from cbbench.reference_engine.execution.cost_model import get_hardware
from cbbench.reference_engine.sim.run_fit import (
    Observed,
    ObservedRun,
    fit_runs,
    simulate_run,
)

TRUTH = {"c0": 0.02, "c_tok": 4e-4, "c_seq": 1e-3, "c_prefill": 0.0, "c_dec_kv": 2e-6,
         "c_pre_ctx": 5e-8, "c_req": 0.004}  # fmt: skip
SETTINGS = {"max_num_seqs": 8, "max_num_batched_tokens": 256}


def measured(rate: float, n: int, seed: int, settings=SETTINGS, truth=TRUTH) -> ObservedRun:
    """A run of the 'server' whose step model is `truth`, as a client would record it."""
    rng = random.Random(seed)
    t, reqs = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        reqs.append(Observed(t, rng.randint(16, 400), rng.randint(8, 80), 0.0, 0.0))
    run = ObservedRun(f"rate-{rate}", reqs)
    pred, _, _ = simulate_run(run, "small", "float32", settings, truth)
    run.requests = [Observed(r.sent_s, r.prompt_len, r.output_len, pred.ttft_s[i], pred.e2e_s[i])
                    for i, r in enumerate(reqs)]  # fmt: skip
    return run


def test_fit_finds_the_server_back_and_predicts_the_held_back_half():
    runs = [measured(1.0, 50, 1), measured(3.0, 50, 2)]
    fit = fit_runs(runs, "small", "float32", SETTINGS, holdout=0.5)
    for m in ("ttft", "tpot", "e2e"):
        assert abs(fit.errors["held_back"][f"{m}_mean"]) < 0.03, fit.errors
        assert abs(fit.errors["all"][f"{m}_p99"]) < 0.08, fit.errors
    assert fit.coef["c0"] == pytest.approx(TRUTH["c0"], rel=0.1)
    assert fit.coef["c_tok"] == pytest.approx(TRUTH["c_tok"], rel=0.25)
    assert fit.identified["c0"].startswith("identified")
    # a pool that never ran out: the runs cannot tell the KV capacity, and say so
    assert any(n.startswith("KV capacity") for n in fit.notes)
    # another workload at another rate, predicted with the fit
    other = measured(2.0, 40, 3)
    pred, _, _ = simulate_run(other, "small", "float32", SETTINGS, fit.coef)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert mean(pred.e2e_s) == pytest.approx(mean([r.e2e_s for r in other.requests]), rel=0.05)


def test_parse_server_config():
    assert parse_server_config("max_num_seqs=16, enable-chunked-prefill=off") == {
        "max_num_seqs": 16, "enable_chunked_prefill": False}  # fmt: skip
    with pytest.raises(CbbenchError, match="KEY=VALUE"):
        parse_server_config("max_seqs=4")
    with pytest.raises(CbbenchError, match="integer"):
        parse_server_config("num_kv_blocks=lots")


def _write_run(folder, run: ObservedRun, settings: dict) -> None:
    folder.mkdir()
    with open(folder / "requests.jsonl", "w") as f:
        for i, r in enumerate(run.requests):
            f.write(json.dumps({
                "id": f"r{i}", "index": i, "prompt_len": r.prompt_len, "output_len": r.output_len,
                "sent_s": r.sent_s, "ttft_s": r.ttft_s, "e2e_s": r.e2e_s,
                "first_token_s": r.sent_s + r.ttft_s, "last_token_s": r.sent_s + r.e2e_s,
                "output_tokens_server": r.output_len, "prompt_tokens_server": r.prompt_len,
            }) + "\n")  # fmt: skip
    meta = {"name": folder.name, "target": {"engine": {"root": "small"},
                                           "server_settings": settings}}  # fmt: skip
    (folder / "run.json").write_text(json.dumps(meta))


def test_cli_from_run_writes_a_hardware_json_sim_and_plan_read(tmp_path, capsys):
    # a reference engine's run records its torch threads: kept with the fit, not replayed
    recorded = {"max_num_seqs": 8, "cpu_threads": 2}
    _write_run(tmp_path / "a1", measured(1.0, 30, 4), recorded)
    _write_run(tmp_path / "a2", measured(3.0, 30, 5), recorded)
    _write_run(tmp_path / "b", measured(2.0, 20, 6), recorded)
    out = tmp_path / "fit.json"
    assert main(["calibrate", "--from-run", str(tmp_path / "a1"), str(tmp_path / "a2"),
                 "--server-config", "max_num_batched_tokens=256", "--check-run",
                 str(tmp_path / "b"), "--out", str(out)]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "held back" in text and "check: b" in text and "not identified: KV capacity" in text
    spec = get_hardware(str(out))
    assert spec.fit["method"] == "from-run" and spec.fit["model"] == "small"
    assert spec.fit["server_settings"] == {"max_num_seqs": 8, "max_num_batched_tokens": 256,
                                           "cpu_threads": 2}  # fmt: skip
    assert set(spec.fit["measured_error"]) >= {"ttft_mean", "tpot_mean", "e2e_mean"}
    assert spec.linear["c0"] == pytest.approx(TRUTH["c0"], rel=0.15)
    assert main(["sim", "--hardware", str(out), "--model", "small", "--workload",
                 "prompt=64,output=16", "--num-requests", "8", "--scheduler", "continuous"]) == 0  # fmt: skip


def test_cli_from_run_refuses_bad_input(tmp_path, capsys):
    assert main(["calibrate", "--from-run", str(tmp_path / "nope")]) != 0
    assert "not a run folder" in capsys.readouterr().err
    _write_run(tmp_path / "a", measured(1.0, 10, 7), {})
    assert main(["calibrate", "--from-run", str(tmp_path / "a"), "--server-config", "x=1"]) != 0
    assert "KEY=VALUE" in capsys.readouterr().err


def test_server_ttft_measures_what_lies_outside_the_engine():
    """With the server's own TTFT on each request, c_req is measured, not fitted."""
    from dataclasses import replace

    runs = [measured(1.0, 30, 8), measured(2.5, 30, 9)]
    for run in runs:
        run.requests = [replace(r, server_ttft_s=r.ttft_s - TRUTH["c_req"]) for r in run.requests]
    fit = fit_runs(runs, "small", "float32", SETTINGS, holdout=0.5, server_ttft=True)
    assert fit.coef["c_req"] == pytest.approx(TRUTH["c_req"], rel=1e-6)
    assert fit.identified["c_req"].startswith("measured")
    assert abs(fit.errors["all"]["e2e_mean"]) < 0.03


def test_intervals_come_from_the_measured_error_or_say_unknown():
    from cbbench.reference_engine.sim.intervals import UNMEASURED_BAND, error_of

    h100 = get_hardware("h100")
    iv, kind, words = error_of(h100)
    assert kind == "unknown" and "error unknown for h100-sxm" in words
    assert (iv.low, iv.high) == (-UNMEASURED_BAND, UNMEASURED_BAND)
    from dataclasses import replace

    fitted = replace(h100, linear={"c0": 0.01},
                     fit={"measured_error": {"tpot_mean": 0.25, "e2e_mean": -0.1,
                                             "ttft_mean": 0.9}, "runs": ["a"]})  # fmt: skip
    iv, kind, words = error_of(fitted)
    # predicted 25 % slow: the real step is 1 / 1.25 = 0.8 of it; the TTFT error is not a
    # step-time error (queueing amplifies it) and stays out
    assert kind == "measured" and iv.high == pytest.approx(0.2) and "measured on a" in words


def test_check_runs_with_a_preset_or_a_fit(tmp_path, capsys):
    """--check-run with --fit HARDWARE alone: how far a preset (or an older fit) is off."""
    _write_run(tmp_path / "r", measured(2.0, 20, 10), {"max_num_seqs": 8})
    assert main(["calibrate", "--check-run", str(tmp_path / "r"), "--fit", "h100",
                 "--server-config", "max_num_batched_tokens=256"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "runs predicted on h100-sxm" in out and "%" in out
    assert main(["calibrate", "--check-run", str(tmp_path / "r")]) != 0
    assert "--check-run also with --fit" in capsys.readouterr().err


def test_sim_intervals_use_the_check_runs_error_not_the_in_sample_one(tmp_path, capsys):
    """`--holdout 0 --check-run B`: the in-sample error is ~0, B (a server twice as slow per
    step) is what a new workload meets: the fit's measured error, and sim's interval, are B's
    (they were the in-sample ~+-1 % and read "+-1% from the error measured on a1, a2")."""
    _write_run(tmp_path / "a1", measured(1.0, 30, 4), {"max_num_seqs": 8})
    _write_run(tmp_path / "a2", measured(3.0, 30, 5), {"max_num_seqs": 8})
    slow = {k: 2 * v for k, v in TRUTH.items()}
    _write_run(tmp_path / "b", measured(1.0, 20, 6, truth=slow), {"max_num_seqs": 8})
    out = tmp_path / "fit.json"
    assert main(["calibrate", "--from-run", str(tmp_path / "a1"), str(tmp_path / "a2"),
                 "--holdout", "0", "--check-run", str(tmp_path / "b"), "--out", str(out)]) == 0  # fmt: skip
    spec = get_hardware(str(out))
    assert spec.fit["measured_error"]["tpot_mean"] < -0.3, spec.fit["measured_error"]
    assert spec.fit["measured_on"] == f"--check-run {tmp_path / 'b'}"
    capsys.readouterr()
    assert main(["sim", "--hardware", str(out), "--model", "small", "--workload",
                 "prompt=64,output=16", "--num-requests", "8", "--scheduler", "continuous"]) == 0  # fmt: skip
    line = next(x for x in capsys.readouterr().out.splitlines() if "error measured on" in x)
    assert "--check-run" in line and "+-1%" not in line, line
    # no held-back requests nor check run: in-sample, and said so
    assert main(["calibrate", "--from-run", str(tmp_path / "a1"), "--holdout", "0",
                 "--out", str(out)]) == 0  # fmt: skip
    assert "in-sample" in get_hardware(str(out)).fit["measured_on"]
