"""`cbbench calibrate --validate-random K`: the random draw family, the error report, the
prediction intervals' maths (reference_engine/sim/random_draws.py, intervals.py), and
`cbbench sim` printing a fit's interval."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from cbbench.harness.cli import main
from cbbench.reference_engine.execution.cost_model import STEP_TERMS, StepWork
from cbbench.reference_engine.sim import random_draws as rd
from cbbench.reference_engine.sim.intervals import (
    Interval,
    drift_spread,
    interval_for,
    run_errors,
    t95,
)
from cbbench.reference_engine.sim.validation import ValidationRow


def test_a_draw_depends_only_on_its_seed_and_index():
    assert rd.draw(7, 3) == rd.draw(7, 3)
    assert rd.draws(7, 5)[3] == rd.draw(7, 3) == rd.draws(7, 9, only=[3])[0]
    assert rd.draw(7, 3) != rd.draw(8, 3) and rd.draw(7, 3) != rd.draw(7, 4)
    d = rd.draw(7, 3)
    assert [(r.prompt_len, r.output_len) for r in d.requests()] == list(d.lengths[: d.num_requests])
    assert d.to_dict()["rerun"] == "--random-seed 7 --draws 3"


def test_the_family_is_wide_and_each_draw_within_its_budget():
    family = rd.draws(0, 300)
    shapes = {d.prompt[0] for d in family} | {d.output[0] for d in family}
    assert shapes == set(rd.SHAPES)
    assert {d.batch_size for d in family} == set(rd.BATCH_SIZES)
    counts = [d.num_requests for d in family]
    assert min(counts) <= 4 and max(counts) >= 30  # short to long
    for feature in (lambda d: d.prefix_tokens > 0, lambda d: d.kv_fraction is not None,
                    lambda d: d.token_budget < 8192):  # fmt: skip
        share = sum(map(feature, family)) / len(family)
        assert 0.15 < share < 0.45
    medians = [d.prompt[1] for d in family]
    assert min(medians) < 20 and max(medians) > 300
    for d in family:
        reqs = d.requests()
        assert len(reqs) == d.num_requests >= 2
        assert all(r.prompt_len >= max(4, d.prefix_tokens + 4) for r in reqs)
        assert all(2 <= r.output_len <= rd.MAX_OUTPUT for r in reqs)
        if d.num_requests > 2:
            assert sum(r.output_len for r in reqs) <= 240 + 110 * d.batch_size
            assert sum(r.prompt_len for r in reqs) <= rd.PROMPT_BUDGET
        assert d.max_model_len >= max(r.prompt_len + r.output_len for r in reqs)


def test_a_draw_check_gives_real_and_simulated_runs_the_draws_settings():
    d = next(x for x in rd.draws(0, 100) if x.kv_fraction is not None and x.prefix_tokens)
    c = rd.DrawCheck(d, "tiny")
    static, cont = c._config("static", "real", "h100"), c._config("continuous", "sim", "x.json")
    assert static.enable_prefix_caching and cont.enable_prefix_caching
    assert cont.num_kv_blocks < static.num_kv_blocks == d.batch_size * -(-d.max_model_len // 16)
    assert cont.num_kv_blocks > -(-d.max_model_len // 16)  # the longest request always fits
    assert cont.continuous.max_num_batched_tokens == max(d.token_budget, d.batch_size)
    jobs = c.real_jobs()
    assert [s for s, _ in jobs] == ["static", "continuous"]
    assert all(job[2] == {"prefix_block_size": rd.PREFIX_BLOCK} for _, job in jobs)
    assert [r.prefix_ids for r in jobs[0][1][0]] == [tuple(range(d.prefix_tokens // 64))] * len(
        d.requests()
    )


def _row(sched: str, sim: float, real: float, drift: float = 1.0, label: str = "w") -> ValidationRow:
    return ValidationRow(label, sched, sim, real, 1.0, 1.0, 0.0, 10, 0, drift)


def test_summary_gives_median_p90_and_max_of_the_absolute_errors_per_scheduler():
    errs = [-0.08, 0.01, 0.02, -0.03, 0.05]
    rows = [_row("static", 100 * (1 + e), 100.0, label=f"d{i}") for i, e in enumerate(errs)]
    rows.append(_row("continuous", 90.0, 100.0, drift=0.9))
    s = rd.summarize(rows)
    absd = np.abs(errs)
    assert s["static"]["draws"] == 5
    assert s["static"]["median_abs"] == pytest.approx(np.quantile(absd, 0.5))
    assert s["static"]["p90_abs"] == pytest.approx(np.quantile(absd, 0.9))
    assert s["static"]["max_abs"] == pytest.approx(0.08) and s["static"]["worst_draw"] == "d0"
    assert s["static"]["median"] == pytest.approx(0.01)
    # drift 0.9: the real run had the machine 10 % faster than the fit's mean
    assert rows[-1].drift_free_error == pytest.approx(0.9 / 0.9 - 1.0)
    assert rd.summarize(rows, "drift_free_error")["continuous"]["max_abs"] == pytest.approx(0.0)


def test_t_quantiles_and_the_drift_spread():
    assert t95(1) == pytest.approx(6.314) and t95(5) == pytest.approx(2.015)
    assert 1.645 < t95(200) < t95(30) == pytest.approx(1.697)
    assert drift_spread([1.0] * 10, 1) == 0.0
    alt = [0.8, 1.2] * 10
    assert drift_spread(alt, 1) == pytest.approx(0.2)
    assert drift_spread(alt, 2) == pytest.approx(0.0)  # every pair averages 1
    assert drift_spread(alt, 3) == pytest.approx(0.2 / 3)
    assert drift_spread(alt, 100) == 0.0  # longer than the fit: its mean is 1 by construction


def test_the_interval_from_run_errors_and_drift():
    fit = {"interval": {"run_errors": [0.01, -0.02, 0.03, 0.0], "speed_factors": [1.0] * 8,
                        "window": 25}}  # fmt: skip
    errs = np.array([0.01, -0.02, 0.03, 0.0])
    q = t95(3) * errs.std(ddof=1) * math.sqrt(1 + 1 / 4)
    iv = interval_for(fit, 100)
    assert iv is not None
    assert iv.low == pytest.approx(errs.mean() - q) and iv.high == pytest.approx(errs.mean() + q)
    fit["interval"]["speed_factors"] = [0.8, 1.2] * 4
    short, long = interval_for(fit, 25), interval_for(fit, 50)
    assert short.high - short.low > long.high - long.low == pytest.approx(2 * q)  # type: ignore[union-attr]
    assert interval_for({}, 100) is None and interval_for({"interval": {"run_errors": [0.1]}}, 1) is None
    band = Interval(-0.1, 0.25)
    assert band.throughput(100.0) == pytest.approx((80.0, 100 / 0.9))
    assert band.latency(2.0) == pytest.approx((1.8, 2.5))


def test_leave_one_run_out_errors_find_the_run_the_others_do_not_explain():
    rng = np.random.default_rng(0)
    works, times, host, rounds, run_of = [], [], [], [], []
    for run in range(4):
        for i in range(60):
            w = StepWork(num_tokens=int(rng.integers(1, 300)), num_seqs=int(rng.integers(1, 9)))
            t = 0.01 + 0.001 * w.num_tokens + 0.0005 * w.num_seqs
            works.append(w)
            times.append(t * (1.2 if run == 3 else 1.0))
            host.append(0.0005 * w.num_seqs)
            rounds.append(i)
            run_of.append(run)
    from cbbench.reference_engine.sim.calibration import fit_step_terms

    errs = run_errors(works, times, host, rounds, run_of, 25, fit_step_terms)
    assert len(errs) == 4
    # the runs 0-2 explain each other exactly: run 3 is priced 1/1.2 of what it took
    assert errs[3] == pytest.approx(1 / 1.2 - 1, abs=1e-3)
    # left out, each of the others is priced on a fit a third of which is the slow run
    assert all(0.05 < e < 0.08 for e in errs[:3])


def _draw_result(real: float, lo_hi: tuple[float, float]) -> rd.DrawResult:
    return rd.DrawResult(rd.draw(0, 0), _row("static", 100.0, real), None, lo_hi, (0.5, 2.0))


def test_the_report_counts_the_draws_whose_real_figure_the_interval_covers():
    res = [_draw_result(95.0, (90.0, 110.0)), _draw_result(120.0, (90.0, 110.0)),
           _draw_result(90.0, (90.0, 110.0))]  # fmt: skip
    assert [r.covered for r in res] == [True, False, True]
    rep = rd.report(res)
    assert rep["throughput"]["static"]["covered"] == 2
    assert rep["e2e_p99"]["static"]["covered"] == 3
    assert "no_drift" not in rep
    d = res[1].to_dict()
    assert d["covered"] is False and d["draw"]["rerun"] == "--random-seed 0 --draws 0"


def test_calibrate_validate_random_flags_are_checked(capsys):
    assert main(["calibrate", "--model", "tiny", "--draws", "1"]) == 2
    assert "--draws only goes with --validate-random" in capsys.readouterr().err
    assert main(["calibrate", "--model", "tiny", "--validate-random", "0"]) == 2
    assert "--validate-random must be >= 1, got 0" in capsys.readouterr().err
    assert main(["calibrate", "--model", "tiny", "--validate-random", "2", "--draws", "x"]) == 2
    assert "--draws: expected a comma list of integers" in capsys.readouterr().err
    assert main(["calibrate", "--validate-random", "2", "--batch-sizes", "1"]) == 2
    assert "--validate-random" in capsys.readouterr().err


def test_calibrate_fit_checks_one_random_draw_and_names_it(capsys, monkeypatch):
    """--fit with --validate-random: the draw runs real and simulated; its line names the
    draw's seed and index and its parameters."""
    monkeypatch.setenv("COLUMNS", "250")
    small = min(range(40), key=lambda i: sum(r.output_len for r in rd.draw(3, i).requests()))
    argv = ["calibrate", "--model", "tiny", "--clock", "cpu", "--fit", "cpu-measured",
            "--validate-random", "40", "--random-seed", "3", "--draws", str(small)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"| 3:{small} |" in text and rd.draw(3, small).describe() in text
    assert "|error| distribution per scheduler" in text and "| static" in text


def test_sim_prints_the_fits_prediction_interval(tmp_path, capsys):
    coef = {t: 0.0 for t in STEP_TERMS} | {"c0": 0.01, "c_tok": 0.001}
    spec = {"name": "fitted", "peak_flops": 1.0, "mem_bw": 1.0, "mem_gb": 2.0,
            "flops_efficiency": 1.0, "bw_efficiency": 1.0, "gpu_memory_utilization": 1.0,
            "linear": coef, "fit": {"interval": {"run_errors": [0.02, -0.01, 0.0],
                                                  "speed_factors": [0.9, 1.1, 1.0], "window": 25}}}  # fmt: skip
    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps(spec))
    rc = main(["sim", "--model", "tiny", "--hardware", str(hw), "--workload", "chat",
               "--num-requests", "6", "--batch-size", "4", "--max-model-len", "2048",
               "--scheduler", "continuous"])  # fmt: skip
    assert rc == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "prediction interval" in x)
    assert line.strip().startswith("continuous: 90% prediction interval from the fit's residuals")
    lo, hi = (float(v) for v in line.split(": ")[-1].split(" output")[0].split("-"))
    tput = float(out.split("steps simulated in")[1].split("; ")[1].split(" output")[0])
    assert lo < tput < hi
