"""The P/D and cluster replays as the served deployment runs (issue #56): each worker draws
its step jitter from a stream of its own (execution/step_jitter.py `own_streams`), the
router counts a worker's requests as of its last poll (router/pd_sim.py `poll_interval_s`),
and the KV hand-off is fitted from a disaggregated run's phase stamps
(harness/planning/pd_handoff.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cbbench.harness.errors import CbbenchError
from cbbench.harness.planning.pd_handoff import fit_handoff, fit_handoff_runs, handoff_samples
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.execution.cost_model import HardwareSpec
from cbbench.reference_engine.execution.step_jitter import fit_jitter
from cbbench.reference_engine.router.cluster_sim import simulate_cluster
from cbbench.reference_engine.router.pd_sim import simulate_pd
from cbbench.reference_engine.router.registry import make_policy
from cbbench.workloads.spec import RequestSpec


def jittered(tmp_path) -> EngineConfig:
    rng = np.random.default_rng(0)
    spec = HardwareSpec("fit-x", 1.0, 1.0, 80.0, flops_efficiency=1.0, bw_efficiency=1.0,
                        linear={"c0": 0.02},
                        fit={"method": "from-run", "model": "small",
                             "step_jitter": fit_jitter(rng.lognormal(0, 0.3, 5000))})  # fmt: skip
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(spec.to_dict()), encoding="utf-8")
    return EngineConfig(model="small", executor="sim", hardware=str(path), max_model_len=512)


def test_each_worker_draws_its_own_jitter(tmp_path):
    cfg = jittered(tmp_path)
    reqs = [RequestSpec(i, 16, 40, arrival_s=0.0) for i in range(2)]  # one on each worker
    res = simulate_pd(reqs, cfg, 0, 2, token_times=True)
    a, b = (np.diff(r.token_times_s) for r in res.requests)
    assert {r.decode_worker for r in res.requests} == {0, 1}
    assert not np.allclose(a, b)  # one shared seed: the same draws, step for step
    again = simulate_pd(reqs, cfg, 0, 2, token_times=True)
    assert [r.token_times_s for r in again.requests] == [r.token_times_s for r in res.requests]
    cl = simulate_cluster(reqs, cfg, 2, make_policy("round-robin"))
    assert {r.replica for r in cl.requests} == {0, 1}
    assert cl.requests[0].finished_s != pytest.approx(cl.requests[1].finished_s)


CPU = EngineConfig(model="tiny", executor="sim", hardware="cpu-measured", max_model_len=512)


def test_the_router_counts_a_worker_as_of_its_last_poll():
    # the first request ends long before the others arrive; the router's read at t=0 saw it
    reqs = [RequestSpec(0, 16, 4, arrival_s=0.0), RequestSpec(1, 16, 200, arrival_s=1.0),
            RequestSpec(2, 16, 4, arrival_s=2.0)]  # fmt: skip
    exact = simulate_pd(reqs, CPU, 0, 2)
    assert exact.requests[0].finished_s < 1.0
    assert [r.decode_worker for r in exact.requests] == [0, 0, 1]
    polled = simulate_pd(reqs, CPU, 0, 2, poll_interval_s=10.0)
    # worker 0 still counts the first request (read at t=0); at t=2 both count one: the lower
    assert [r.decode_worker for r in polled.requests] == [0, 1, 0]
    often = simulate_pd(reqs, CPU, 0, 2, poll_interval_s=0.5)  # read at 1.0: worker 0 is free
    assert [r.decode_worker for r in often.requests] == [0, 0, 1]


def record(i: int, nbytes: int, c_req: float, handoff: float, pull: float) -> dict:
    ph = {"prefill_queue_s": 0.001 * i, "prefill_s": 0.05, "kv_transfer_s": pull,
          "kv_transfer_bytes": nbytes, "decode_queue_s": 0.002}  # fmt: skip
    ttft = c_req + ph["prefill_queue_s"] + 0.05 + handoff + 0.002
    return {"sent_s": 10.0 * i, "ttft_s": ttft, "e2e_s": ttft + 1.0, "extra": {"phases": ph}}


def test_the_hand_off_is_what_the_stamps_leave_out_less_the_overhead(tmp_path):
    sizes = [1 << 20, 4 << 20, 9 << 20] * 4
    recs = [record(i, b, 0.012, 0.020 + b / 1e9, 0.003 + b / 5e9) for i, b in enumerate(sizes)]
    (tmp_path / "requests.jsonl").write_text("\n".join(map(json.dumps, recs)) + "\n")
    link = fit_handoff_runs([tmp_path], {"c_req": 0.012, "c_req_load": 0.0})
    got = dict(kv.split("=") for kv in link.split(","))
    assert float(got["latency_ms"]) == pytest.approx(20.0, rel=0.01)
    assert float(got["bandwidth_gbps"]) == pytest.approx(1.0, rel=0.01)
    pull = dict(kv.split("=") for kv in fit_handoff_runs([tmp_path], pull_only=True).split(","))
    assert float(pull["latency_ms"]) == pytest.approx(3.0, rel=0.01)
    assert float(pull["bandwidth_gbps"]) == pytest.approx(5.0, rel=0.01)
    with pytest.raises(CbbenchError, match="two KV sizes"):
        fit_handoff(handoff_samples(recs[:1]))


def test_calibrate_from_run_fits_the_hand_off_of_disaggregated_runs(tmp_path, capsys):
    from cbbench.harness.cli import main
    from cbbench.reference_engine.execution.cost_model import get_hardware

    rng = np.random.default_rng(1)
    for k, rate in enumerate((1.0, 3.0)):  # a served engine's runs: streamed, stamped
        folder = tmp_path / f"agg{k}"
        folder.mkdir()
        t, rows = 0.0, []
        for i in range(30):
            t += rng.exponential(1 / rate)
            prompt, out = int(rng.integers(16, 200)), int(rng.integers(8, 40))
            ttft = 0.01 + 0.02 + 4e-4 * prompt
            itl = [0.02] * (out - 1)
            rows.append({"id": f"r{i}", "index": i, "prompt_len": prompt, "output_len": out,
                         "sent_s": t, "ttft_s": ttft, "e2e_s": ttft + sum(itl), "itl_s": itl,
                         "first_token_s": t + ttft, "last_token_s": t + ttft + sum(itl),
                         "output_tokens_server": out, "prompt_tokens_server": prompt,
                         "extra": {"server_timing": {"queue_s": 0.0, "prefill_s": ttft - 0.01}}})  # fmt: skip
        (folder / "requests.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n")
        (folder / "run.json").write_text(json.dumps({"name": folder.name, "target": {
            "engine": {"root": "small"}, "server_settings": {"max_num_seqs": 8}}}))  # fmt: skip
    pd = tmp_path / "pd"
    pd.mkdir()
    recs = [record(i, b, 0.01, 0.030 + b / 2e9, 0.002 + b / 8e9)
            for i, b in enumerate([1 << 20, 8 << 20] * 6)]  # fmt: skip
    (pd / "requests.jsonl").write_text("\n".join(map(json.dumps, recs)) + "\n")
    out = tmp_path / "fit.json"
    assert main(["calibrate", "--from-run", str(tmp_path / "agg0"), str(tmp_path / "agg1"),
                 "--server-ttft", "--server-config", "max_num_batched_tokens=256",
                 "--holdout", "0", "--kv-handoff", str(pd), "--out", str(out)]) == 0  # fmt: skip
    assert "KV hand-off from 1 disaggregated run(s)" in capsys.readouterr().out
    spec = get_hardware(str(out))
    assert spec.fit["request_overhead_s"] == pytest.approx(0.01, abs=0.002)
    got = dict(kv.split("=") for kv in spec.fit["kv_link"].split(","))
    assert float(got["latency_ms"]) == pytest.approx(30.0, abs=2.5)
    assert float(got["bandwidth_gbps"]) == pytest.approx(2.0, rel=0.05)
    # bad input: one line naming what, no traceback
    assert main(["calibrate", "--from-run", str(tmp_path / "agg0"), "--kv-handoff",
                 str(tmp_path / "nope")]) != 0  # fmt: skip
    got = capsys.readouterr()
    assert "--kv-handoff" in got.err and "no requests.jsonl" in got.err
    assert "request overhead" not in got.out  # refused before the fit, not after it
    assert main(["calibrate", "--kv-handoff", str(pd)]) != 0
