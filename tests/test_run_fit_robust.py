"""The from-run fit on servers that behave like real ones (reference_engine/sim/run_fit.py):
an overhead outside the engine that grows with the requests in flight, per-request noise and
rare stalls many times a normal step. The first half of each run is fitted; the fit must
predict the whole run's TTFT, TPOT and E2E means within 5 % and p99s within 10 % (the
p99s here come from queueing, which the replay of the run's real arrivals models; a stall's
own tail is not predictable and the robust loss keeps stalls from moving the step terms)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from cbbench.reference_engine.sim.run_fit import (
    Observed,
    ObservedRun,
    fit_runs,
    in_flight,
    simulate_run,
)

SETTINGS = {"max_num_seqs": 8, "max_num_batched_tokens": 256}
TRUTH = {"c0": 0.02, "c_tok": 4e-4, "c_seq": 1e-3, "c_dec_kv": 2e-6, "c_req": 0.004,
         "c_req_load": 0.006}  # fmt: skip


def server_run(rate: float, n: int, seed: int, noise: float = 0.03, stalls: float = 0.0,
               stall_s: float = 0.6, truth=TRUTH) -> ObservedRun:  # fmt: skip
    """A run of a server whose step model is `truth` (its front end slower by c_req_load a
    request in flight), as a client records it: every request's decode time jittered by
    `noise` (relative), and a fraction `stalls` of requests held `stall_s` before their
    first token."""
    rng = random.Random(seed)
    t, reqs = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        reqs.append(Observed(t, rng.randint(16, 400), rng.randint(8, 80), 0.0, 0.0))
    run = ObservedRun(f"rate-{rate}", reqs)
    pred, _, _ = simulate_run(run, "small", "float32", SETTINGS, truth)
    out = []
    for i, r in enumerate(reqs):
        stall = stall_s if rng.random() < stalls else 0.0
        decode = (pred.e2e_s[i] - pred.ttft_s[i]) * (1 + rng.uniform(-noise, noise))
        ttft = pred.ttft_s[i] * (1 + rng.uniform(-noise, noise)) + stall
        out.append(Observed(r.sent_s, r.prompt_len, r.output_len, ttft, ttft + decode))
    run.requests = out
    return run


def test_in_flight_counts_the_others_sent_and_not_finished():
    assert list(in_flight([0.0, 1.0, 2.0, 5.0], [3.0, 0.5, 1.0, 1.0])) == [0, 1, 1, 0]


def test_first_half_predicts_the_whole_run_with_a_load_dependent_overhead():
    runs = [server_run(1.5, 60, 1), server_run(4.0, 60, 2)]
    fit = fit_runs(runs, "small", "float32", SETTINGS, holdout=0.5)
    err = fit.errors["all"]
    for m in ("ttft", "tpot", "e2e"):
        assert abs(err[f"{m}_mean"]) < 0.05, err
        assert abs(err[f"{m}_p99"]) < 0.10, err
    # found back, not absorbed into the constant part
    assert fit.coef["c_req_load"] == pytest.approx(TRUTH["c_req_load"], rel=0.3), fit.coef
    assert fit.coef["c0"] == pytest.approx(TRUTH["c0"], rel=0.1), fit.coef


def test_rare_stalls_do_not_move_the_step_terms():
    """3 % of requests stalled 0.6 s (30 steps): with the robust loss the step terms stay
    near the truth and the whole run's TPOT and E2E means within 5 %."""
    runs = [server_run(1.5, 60, 3, stalls=0.03), server_run(4.0, 60, 4, stalls=0.03)]
    fit = fit_runs(runs, "small", "float32", SETTINGS, holdout=0.5)
    assert fit.coef["c0"] == pytest.approx(TRUTH["c0"], rel=0.15), fit.coef
    # least squares alone: c_tok 5 % of the truth, c_req_load 3.3x (the stalls' TTFTs)
    assert fit.coef["c_tok"] == pytest.approx(TRUTH["c_tok"], rel=0.5), fit.coef
    assert fit.coef["c_req_load"] < 2.5 * TRUTH["c_req_load"], fit.coef
    err = fit.errors["all"]
    for m in ("ttft", "tpot", "e2e"):
        assert abs(err[f"{m}_mean"]) < 0.05, err


def test_server_ttft_measures_a_load_dependent_overhead():
    """With the server's own TTFT, what lies outside it is measured against the load."""
    runs = [server_run(1.5, 40, 6, noise=0.0), server_run(4.0, 40, 7, noise=0.0)]
    for run in runs:
        load = in_flight([r.sent_s for r in run.requests], [r.e2e_s for r in run.requests])
        run.requests = [replace(r, server_ttft_s=r.ttft_s - TRUTH["c_req"]
                                - TRUTH["c_req_load"] * x) for r, x in zip(run.requests, load, strict=True)]  # fmt: skip
    fit = fit_runs(runs, "small", "float32", SETTINGS, holdout=0.5, server_ttft=True)
    assert fit.coef["c_req"] == pytest.approx(TRUTH["c_req"], rel=0.05)
    assert fit.coef["c_req_load"] == pytest.approx(TRUTH["c_req_load"], rel=0.05)
    assert fit.identified["c_req_load"].startswith("measured")
