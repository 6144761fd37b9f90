"""A from-run fit's step jitter (reference_engine/execution/step_jitter.py, issue #56): the
fit stores the measured / predicted ratio of one-step decode gaps as a mean-1 distribution,
the simulator multiplies each step's time by a seeded draw from it, so a simulated ITL gets
the tail a real server's step jitter gives it. Specs without it are unchanged."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from cbbench.harness.studies.simulation import SimOptions, simulate
from cbbench.reference_engine.execution.cost_model import HardwareSpec
from cbbench.reference_engine.execution.step_jitter import StepJitter, fit_jitter, quantile_of
from cbbench.reference_engine.sim.run_fit import Observed, ObservedRun, fit_runs, simulate_run


def noise(n: int, seed: int) -> list[float]:
    """A server's step ratios: mostly +-15 %, 3 % of steps 2-4x (a GC, the API process)."""
    rng = np.random.default_rng(seed)
    x = rng.lognormal(0.0, 0.12, n)
    slow = rng.random(n) < 0.03
    x[slow] *= rng.uniform(2.0, 4.0, int(slow.sum()))
    return x.tolist()


TRUTH_JITTER = fit_jitter(noise(20000, 1))


def test_fit_jitter_is_mean_one_and_needs_enough_gaps():
    j = TRUTH_JITTER
    assert j is not None and len(j["quantiles"]) == 64 and j["gaps"] == 20000
    draws = StepJitter(j, seed=3)
    assert np.mean([draws.draw() for _ in range(50000)]) == pytest.approx(1.0, abs=0.01)
    assert quantile_of(j, 0.99) > 2.0 > 1.1 > quantile_of(j, 0.5)
    assert fit_jitter(noise(49, 2)) is None


def fit_json(path, jitter: dict | None) -> str:
    spec = HardwareSpec("fit-x", 1.0, 1.0, 80.0, flops_efficiency=1.0, bw_efficiency=1.0,
                        linear={"c0": 0.02},
                        fit={"method": "from-run", "model": "small",
                             **({"step_jitter": jitter} if jitter else {})})  # fmt: skip
    path.write_text(json.dumps(spec.to_dict()), encoding="utf-8")
    return str(path)


def sim_itls(hw: str, seed: int = 0) -> np.ndarray:
    opts = SimOptions(workload="prompt=16,output=100", schedulers=["continuous"],
                      engine={"hardware": hw, "model": "small"}, num_requests=20, rate=0.4,
                      seed=seed)  # fmt: skip
    res = simulate(opts).results["continuous"]
    return np.concatenate([np.diff(r.token_times_s) for r in res.requests])


def test_sim_draws_each_step_from_the_fits_jitter(tmp_path):
    plain = sim_itls(fit_json(tmp_path / "plain.json", None))
    assert plain == pytest.approx(np.full(len(plain), 0.02))  # every step c0: no tail
    hw = fit_json(tmp_path / "jitter.json", TRUTH_JITTER)
    itl = sim_itls(hw)
    p50, p99 = np.percentile(itl, [50, 99])
    # the tail is the distribution's: p99 over p50 as its quantiles say, the mean kept
    want = quantile_of(TRUTH_JITTER, 0.99) / quantile_of(TRUTH_JITTER, 0.5)
    assert p99 / p50 == pytest.approx(want, rel=0.15)
    assert itl.mean() == pytest.approx(0.02, rel=0.05)
    assert np.array_equal(sim_itls(hw), itl)  # seeded: the same seed, the same run
    assert not np.array_equal(sim_itls(hw, seed=1), itl)


SETTINGS = {"max_num_seqs": 8, "max_num_batched_tokens": 256}
TRUTH = {"c0": 0.02, "c_tok": 4e-4, "c_seq": 1e-3, "c_dec_kv": 2e-6}


def token_times(run: ObservedRun, coef: dict, jitter: dict | None) -> list[list[float]]:
    """Each request's token times (seconds from the run's start) in a replay of `run`."""
    _, log, sreqs = simulate_run(run, "small", "float32", SETTINGS, coef, jitter=jitter)
    times: dict[str, list[float]] = {}
    for _, end, _, items in log.steps:
        for rid, s in items:
            if s:
                times.setdefault(rid, []).append(end)
    return [times[q.request_id] for q in sreqs]


def server_run(rate: float, n: int, seed: int) -> ObservedRun:
    """A server whose steps are TRUTH times a TRUTH_JITTER draw, as a client records it."""
    rng = random.Random(seed)
    t, reqs = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        reqs.append(Observed(t, rng.randint(16, 48), rng.randint(20, 80), 0.0, 0.0))
    run = ObservedRun(f"rate-{rate}", reqs)
    times = token_times(run, TRUTH, TRUTH_JITTER)
    run.requests = [Observed(r.sent_s, r.prompt_len, len(ts), ts[0] - r.sent_s,
                             ts[-1] - r.sent_s, itl_s=tuple(np.diff(ts)))
                    for r, ts in zip(reqs, times, strict=True)]  # fmt: skip
    return run


def itl_p99(runs, coef, jitter) -> float:
    gaps = [np.diff(ts) for r in runs for ts in token_times(r, coef, jitter)]
    return float(np.percentile(np.concatenate(gaps), 99))


def test_from_run_fit_finds_the_servers_step_jitter():
    runs = [server_run(1.0, 40, 1), server_run(3.0, 40, 2)]
    fit = fit_runs(runs, "small", "float32", SETTINGS, holdout=0.5, step_jitter=True)
    assert fit_runs(runs, "small", "float32", SETTINGS, holdout=0.5).jitter is None  # opt-in
    assert fit.jitter is not None and fit.jitter_gaps >= 500
    assert quantile_of(fit.jitter, 0.99) == pytest.approx(quantile_of(TRUTH_JITTER, 0.99),
                                                          rel=0.2)  # fmt: skip
    measured = float(np.percentile(np.concatenate([r.itl_s for q in runs for r in q.requests
                                                   if r.itl_s]), 99))  # fmt: skip
    assert itl_p99(runs, fit.coef, fit.jitter) == pytest.approx(measured, rel=0.15)
    # without it the replay's gaps have no tail of their own
    assert itl_p99(runs, fit.coef, None) < 0.75 * measured


def test_sim_says_the_jitter(tmp_path, capsys):
    from cbbench.harness.cli import main

    args = ["sim", "--model", "small", "--workload", "prompt=16,output=8", "--num-requests", "4",
            "--scheduler", "continuous"]  # fmt: skip
    assert main([*args, "--hardware", fit_json(tmp_path / "j.json", TRUTH_JITTER)]) == 0
    assert "step jitter from the fit" in capsys.readouterr().out
    assert main([*args, "--hardware", fit_json(tmp_path / "p.json", None)]) == 0
    assert "step jitter" not in capsys.readouterr().out


def test_step_jitter_without_runs_is_one_line(capsys):
    from cbbench.harness.cli import main

    # fitted from the runs' gaps: alone it would be ignored while the engine is calibrated
    assert main(["calibrate", "--model", "tiny", "--step-jitter"]) == 2
    err = capsys.readouterr().err
    assert "--step-jitter goes with --from-run" in err and "Traceback" not in err
