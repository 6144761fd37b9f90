"""P/D in the simulator and the planner (router/pd_sim.py, harness/planning/pd.py):
the pools' basic properties, the link's price, and `cbbench plan` printing an aggregated and
a disaggregated frontier and picking one with its P:D ratio. Every figure is SIMULATED."""

from __future__ import annotations

import pytest
from cbbench.harness.cli import main
from cbbench.harness.errors import CbbenchError
from cbbench.harness.planning import space as plan_space
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.kv_link import LINKS, get_link
from cbbench.reference_engine.router.pd_sim import simulate_pd
from cbbench.workloads.spec import RequestSpec

H100 = EngineConfig(model="llama-3-8b", executor="sim", hardware="h100", dtype="bfloat16")


def mixed(n: int = 120, gap: float = 0.05) -> list[RequestSpec]:
    """Decode streams (64-token prompts, 128 out) with a 4k prompt every fifth request."""
    return [RequestSpec(i, 4096 if i % 5 == 0 else 64, 8 if i % 5 == 0 else 128,
                        arrival_s=i * gap) for i in range(n)]  # fmt: skip


def test_pools_conserve_tokens_and_order_phases():
    reqs = mixed()
    res = simulate_pd(reqs, H100, 1, 1, get_link("same-node"), token_times=True)
    assert [r.index for r in res.requests] == list(range(len(reqs)))
    for spec, r in zip(reqs, res.requests, strict=True):
        assert r.num_tokens == spec.output_len and len(r.token_times_s) == spec.output_len
        assert r.prefill_worker == 0 and r.decode_worker == 1
        ph = r.phases()
        assert all(v is not None and v >= 0 for v in ph.values()), ph
        # arrival <= prefill <= transfer <= decode admission <= finish; TTFT = up to the import
        assert r.first_token_s == pytest.approx(r.transfer_end_s)
        assert r.arrival_s <= r.prefill_start_s <= r.prefill_end_s < r.transfer_end_s
        assert r.transfer_end_s <= r.decode_start_s <= r.finished_s
        # bf16 llama-3-8b: 128 KiB a token, whole 16-token blocks
        assert r.kv_bytes == -(-spec.prompt_len // 16) * 16 * 131072
        assert r.phases()["kv_transfer_s"] == pytest.approx(
            LINKS["same-node"].transfer_s(r.kv_bytes)
        )
    # the decode worker never computes a prompt: its busy time is decode steps only
    assert res.replicas[0].requests == res.replicas[1].requests == len(reqs)


def test_disaggregation_cuts_the_itl_tail_long_prompts_make():
    reqs = mixed()
    agg = simulate_pd(reqs, H100, 0, 2, token_times=True).summary()
    dis = simulate_pd(reqs, H100, 1, 1, get_link("same-node"), token_times=True).summary()
    assert agg["mode"] == "aggregated" and dis["mode"] == "disaggregated"
    assert dis["itl_s"]["p99"] < 0.5 * agg["itl_s"]["p99"]
    # a slower link costs TTFT, never tokens
    slow = simulate_pd(reqs, H100, 1, 1, get_link("bandwidth_gbps=1,latency_ms=5")).summary()
    assert slow["ttft_s"]["p50"] > dis["ttft_s"]["p50"]
    assert slow["num_requests"] == dis["num_requests"] == len(reqs)


def test_kv_dtype_shrinks_what_crosses_the_link():
    reqs = mixed(20)
    full = simulate_pd(reqs, H100, 1, 1, get_link("cross-node")).summary()
    fp8 = simulate_pd(reqs, EngineConfig(**{**H100.__dict__, "kv_cache_dtype": "fp8"}), 1, 1,
                      get_link("cross-node")).summary()  # fmt: skip
    ratio = fp8["kv_transfer_bytes_mean"] / full["kv_transfer_bytes_mean"]
    assert ratio == pytest.approx((128 + 1) / 256)  # one byte a element + a scale a row


def test_bad_pd_input_says_what():
    with pytest.raises(EngineError, match="--kv-link"):
        get_link("fast")
    with pytest.raises(EngineError, match="needs a KV link"):
        simulate_pd(mixed(3), H100, 1, 1, None)
    with pytest.raises(CbbenchError, match="--space prefill"):
        plan_space.parse_space("mode=disaggregated;prefill=0..2")
    sp = plan_space.parse_space(
        "mode=aggregated,disaggregated;prefill=1..2;decode=1..;"
        "replicas=1-6;max_num_seqs=64;max_num_batched_tokens=2048"
    )
    kinds = [(c.get("mode", "aggregated"), c.get("prefill")) for c in sp.configs()]
    assert kinds == [("aggregated", None), ("disaggregated", 1), ("disaggregated", 2)]
    assert sp.decode_range() == (1, 6)


def test_plan_prints_both_frontiers_and_picks_one_with_its_ratio(capsys):
    rc = main(["plan", "--workload", "chat", "--rate", "12", "--slo", "ttft_p99=2s,tpot_p99=40ms",
               "--hardware", "h100", "--price", "3", "--num-requests", "60", "--space",
               "mode=aggregated,disaggregated;prefill=1..2;decode=1..3;replicas=1-4;"
               "max_num_seqs=64;max_num_batched_tokens=2048"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "SIMULATED aggregated Pareto frontier" in out
    assert "SIMULATED disaggregated Pareto frontier" in out
    disagg = out[out.index("disaggregated Pareto frontier") : out.index("chosen:")]
    assert "1P:" in disagg and "P/D 1:" in disagg
    chosen = next(x for x in out.splitlines() if x.startswith("chosen: "))
    if "P:" in chosen:  # the cheaper was disaggregated: its serve lines name both pools
        assert "--prefill-replicas" in out and "NixlConnector" in out and "is-prefill-worker" in out
    else:
        assert "cbbench serve --model llama-3-8b" in out


def _synthetic_run(stall: float, shared: bool = True):
    """Six 16-token streams decoding at 10 ms a token for 3 s; a 1200-token prompt every 0.5 s
    whose prefill (0.3 s) stalls them (`shared`: each token gap inside a prefill grows to
    `stall`), else runs elsewhere."""
    from pathlib import Path

    from cbbench.harness.results.records import RequestRecord
    from cbbench.harness.results.run_folder import Run

    recs, windows = [], [(0.4 + 0.5 * k, 0.7 + 0.5 * k) for k in range(5)]
    for k, (a, b) in enumerate(windows):
        recs.append(RequestRecord(f"long{k}", 100 + k, 1200, 2, sent_s=a, first_token_s=b,
                                  token_times_s=[b, b + 0.01], prompt_tokens_server=1200))  # fmt: skip
    for i in range(6):
        t, times = 0.05 * i, []
        while t < 3.0:
            inside = shared and any(a <= t < e for a, e in windows)
            t += stall if inside else 0.01
            times.append(t)
        recs.append(RequestRecord(f"s{i}", i, 16, len(times), sent_s=0.0, first_token_s=times[0],
                                  token_times_s=times, prompt_tokens_server=16))  # fmt: skip
    meta = {"summary": {}, "engine": {"scheduler": "continuous"}}
    return Run(Path("synthetic"), meta, recs, [])


def test_pd_interference_rule_on_synthetic_runs():
    """Fires when the ITL tail sits inside long prompts' prefills; silent when the same
    prompts run elsewhere (no tail), or when the records carry P/D phases."""
    from cbbench.harness.diagnose.base import RunView
    from cbbench.harness.diagnose.rules import pd_interference

    f = pd_interference.check(RunView(_synthetic_run(0.1)))
    assert f is not None and f.values["tail_share_in_prefill"] == 1.0
    assert f.values["long_prompts"] == 5 and f.values["itl_p99_s"] >= 4 * f.values["itl_p50_s"]
    assert pd_interference.check(RunView(_synthetic_run(0.1, shared=False))) is None
    run = _synthetic_run(0.1)
    run.records[0].extra["phases"] = {"kv_transfer_s": 0.001}
    assert pd_interference.check(RunView(run)) is None


@pytest.mark.slow
def test_diagnose_names_prefill_decode_interference(tmp_path):
    """An aggregated server whose ITL tail is made of long prompts' prefill steps: the rule
    fires with numbers and names disaggregation in each engine's flags; a run whose records
    carry P/D phases (a disaggregated server) is not blamed."""
    from cbbench.harness.diagnose import ENGINES, diagnose_run
    from cbbench.harness.results.run_folder import load_run

    from tests.diagnose_support import provoke

    run = load_run(provoke("pd-interference", tmp_path))
    found = {f.rule: f for f in diagnose_run(run).findings}
    f = found["pd-interference"]
    assert f.values["tail_share_in_prefill"] >= 0.5 and f.values["long_prompts"] == 6
    assert f.values["itl_p99_s"] >= 4 * f.values["itl_p50_s"]
    assert set(f.fixes) == set(ENGINES)
    assert "--prefill-replicas" in f.fixes["cbbench"] and "NixlConnector" in f.fixes["vllm"]
    assert "--disaggregation-mode" in f.fixes["sglang"]
    for r in run.records:
        r.extra["phases"] = {"kv_transfer_s": 0.001}
    assert "pd-interference" not in {f.rule for f in diagnose_run(run).findings}


def test_sim_compares_aggregated_and_disaggregated(tmp_path, capsys):
    rc = main(["sim", "--workload", "chat", "--rate", "20", "--num-requests", "40",
               "--prefill-replicas", "1", "--decode-replicas", "1", "--kv-link", "cross-node",
               "--hardware", "h100", "--out", str(tmp_path)])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "aggregated (2 replicas)" in out and "disaggregated (1P:1D, cross-node)" in out
    assert "kv transfer p50 (ms)" in out and (tmp_path / "pd_compare.json").exists()
    rc = main(["sim", "--workload", "chat", "--num-requests", "5", "--prefill-replicas", "1",
               "--decode-replicas", "1", "--kv-link", "warp"])  # fmt: skip
    assert rc != 0 and "--kv-link 'warp'" in capsys.readouterr().err


def test_decode_pool_under_kv_pressure_preempts_and_still_finishes_everything():
    """A decode worker whose pool holds a few requests preempts imported ones (they recompute
    prompt and outputs there, the payload long gone) and every token still comes out."""
    reqs = [RequestSpec(i, 512, 64, arrival_s=0.001 * i) for i in range(24)]
    small = EngineConfig(**{**H100.__dict__, "num_kv_blocks": 200})  # ~6 requests' worth
    res = simulate_pd(reqs, small, 1, 1, get_link("same-node"), token_times=True)
    assert all(r.num_tokens == 64 and r.finished_s is not None for r in res.requests)
    assert all(len(r.token_times_s) == 64 for r in res.requests)
    assert max(r.phases()["decode_queue_s"] for r in res.requests) > 0  # waited for blocks


def test_space_takes_custom_kv_links_beside_presets():
    """A custom link's own commas are not list separators (presets and fit were the only
    values --space kv_link took)."""
    sp = plan_space.parse_space(
        "mode=disaggregated;kv_link=same-node,bandwidth_gbps=50,latency_ms=0.1,"
        "bandwidth_gbps=5,latency_ms=1,fit"
    )
    assert sp.kv_link == ["same-node", "bandwidth_gbps=50,latency_ms=0.1",
                          "bandwidth_gbps=5,latency_ms=1", "fit"]  # fmt: skip
    assert get_link(sp.kv_link[1]).latency_s == pytest.approx(1e-4)
    for bad in ("warp", "bandwidth_gbps=x,latency_ms=1", "bandwidth_gbps=5"):
        with pytest.raises(CbbenchError, match="--space kv_link"):
            plan_space.parse_space(f"kv_link={bad}")
