"""A from-run fit's request overhead (reference_engine/sim/request_overhead.py) in `sim` and
`plan`: each request pays `c_req + c_req_load x in_flight` before the engine sees it, as
`calibrate --check-run` predicts a run, and both commands say so on screen."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cbbench.harness.cli import main
from cbbench.harness.planning.planner import PlanOptions, _simulate
from cbbench.harness.planning.space import parse_slos
from cbbench.harness.studies.simulation import SimOptions, simulate
from cbbench.reference_engine.execution.cost_model import HardwareSpec
from cbbench.workloads.spec import RequestSpec


def fit_json(path, c_req: float, c_req_load: float = 0.0) -> str:
    spec = HardwareSpec("fit-x", 1.0, 1.0, 80.0, flops_efficiency=1.0, bw_efficiency=1.0,
                        linear={"c0": 0.02, "c_tok": 3e-4, "c_seq": 1e-3},
                        fit={"method": "from-run", "model": "small",
                             "request_overhead_s": c_req,
                             "request_overhead_per_in_flight_s": c_req_load})  # fmt: skip
    path.write_text(json.dumps(spec.to_dict()), encoding="utf-8")
    return str(path)


def sim_ttfts(hw: str) -> tuple[np.ndarray, np.ndarray]:
    opts = SimOptions(workload="prompt=200,output=16", schedulers=["continuous"],
                      engine={"hardware": hw, "model": "small"}, num_requests=24, rate=4.0)  # fmt: skip
    res = simulate(opts).results["continuous"]
    reqs = sorted(res.requests, key=lambda r: r.index)
    return np.array([r.ttft_s for r in reqs]), np.array([r.e2e_s for r in reqs])


def test_sim_adds_the_fits_request_overhead(tmp_path):
    base_t, base_e = sim_ttfts(fit_json(tmp_path / "none.json", 0.0))
    t, e = sim_ttfts(fit_json(tmp_path / "c_req.json", 0.05))
    # a constant overhead shifts every arrival alike: each TTFT and E2E grows by it exactly
    assert t - base_t == pytest.approx(np.full(len(t), 0.05), abs=1e-9)
    assert e - base_e == pytest.approx(np.full(len(e), 0.05), abs=1e-9)
    # per request in flight: more on top (the engine's own share moves with the spread
    # arrivals, so per request it is not a plain sum)
    t2, _ = sim_ttfts(fit_json(tmp_path / "load.json", 0.05, 0.01))
    assert t2.mean() > t.mean() + 0.005


def test_sim_and_plan_say_the_overhead(tmp_path, capsys):
    hw = fit_json(tmp_path / "fit.json", 0.04, 0.002)
    assert main(["sim", "--hardware", hw, "--model", "small", "--workload", "prompt=64,output=8",
                 "--num-requests", "6", "--schedulers", "continuous"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "request overhead from the fit: 40.0 ms + 2.00 ms x requests in flight" in out
    opts = PlanOptions("chat", 2.0, parse_slos("ttft_p99=2s"), hw, 1.0)
    reqs = [RequestSpec(i, 64, 8, arrival_s=i * 0.5) for i in range(6)]
    c = {"scheduler": "continuous", "max_num_seqs": 8, "max_num_batched_tokens": 512,
         "chunked_prefill": True, "kv_cache_dtype": "auto", "router": "round-robin"}  # fmt: skip
    with_over, _, _ = _simulate(opts, "small", reqs, c, 1, 0, 512)
    opts0 = PlanOptions("chat", 2.0, opts.slos, fit_json(tmp_path / "zero.json", 0.0), 1.0)
    without, _, _ = _simulate(opts0, "small", reqs, c, 1, 0, 512)
    assert with_over["ttft_p99"] == pytest.approx(without["ttft_p99"] + 0.04, abs=0.003)


def test_sim_pd_compare_pays_the_overhead_in_both_deployments(tmp_path, capsys):
    from cbbench.harness.studies.pd_compare import PDCompareOptions, pd_compare
    from rich.console import Console

    def run(hw: str) -> dict:
        so = SimOptions(workload="prompt=64,output=8", schedulers=["continuous"],
                        engine={"hardware": hw, "model": "small"}, num_requests=8, rate=2.0)  # fmt: skip
        return pd_compare(PDCompareOptions(so, 1, 1, "same-node"), Console(file=None, quiet=True))

    base = run(fit_json(tmp_path / "zero.json", 0.0))
    got = run(fit_json(tmp_path / "c_req.json", 0.03))
    # a constant shifts every TTFT alike: once aggregated; disaggregated over a preset link
    # once per server hop, prefill's and decode's (test_pd_sim_hops has the measured-link case)
    for mode, hops in (("aggregated", 1), ("disaggregated", 2)):
        assert got[mode]["ttft_s"]["mean"] == pytest.approx(
            base[mode]["ttft_s"]["mean"] + 0.03 * hops, abs=1e-6)  # fmt: skip
