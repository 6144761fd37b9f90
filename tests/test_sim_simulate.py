"""simulate(): the engine over the virtual clock, on the workloads presets."""

from __future__ import annotations

import pytest
from cbbench.reference_engine.config.engine_config import (
    ContinuousConfig,
    DynamicConfig,
    EngineConfig,
    StaticConfig,
)
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.sim.simulate import prompt_tokens, replay_interleaved, simulate
from cbbench.workloads import load_workload, with_arrivals
from cbbench.workloads.spec import RequestSpec


def config(scheduler: str, b: int, hardware: str = "h100", **kw) -> EngineConfig:
    return EngineConfig(
        model=kw.pop("model", "llama-3-8b"),
        dtype="auto",
        scheduler=scheduler,
        executor="sim",
        hardware=hardware,
        static=StaticConfig(batch_size=b),
        dynamic=DynamicConfig(max_batch_size=b),
        continuous=ContinuousConfig(max_num_seqs=b, max_num_batched_tokens=8192),
        **kw,
    )


def throughput_ratio(workload: str, n: int = 32, b: int = 8) -> float:
    wl = load_workload(workload, seed=0, num_requests=n)
    tput = {
        s: simulate(wl.requests, config(s, b)).summary()["output_throughput"]
        for s in ("static", "continuous")
    }
    return tput["continuous"] / tput["static"]


def test_seed_demo_timeline():
    wl = load_workload("seed-demo")
    res = {
        s: simulate(wl.requests, config(s, 4, "steps"), timeline=True)
        for s in ("static", "continuous")
    }
    assert [len(r.steps) for r in res.values()] == [22, 15]
    st = res["static"].steps
    # step 4: request D (3 tokens) is done but still holds slot 3, idle
    assert st[3].slots == ["req-0", "req-1", "req-2", None] and st[3].held[3] == "req-3"
    ct = res["continuous"].steps
    assert ct[3].slots[3] == "req-4"  # refilled in the very next step
    c = res["continuous"].summary()
    assert c["duration_s"] == 15 and c["total_output_tokens"] == 44
    assert res["static"].summary()["batch_occupancy_mean"] == pytest.approx(44 / (22 * 4))
    r4 = res["continuous"].requests[4]
    assert (r4.arrival_s, r4.first_scheduled_s, r4.first_token_s, r4.finished_s) == (0, 3, 4, 15)
    assert r4.ttft_s == 4 and r4.tpot_s == 1 and r4.queue_s == 3


def test_no_gain_on_uniform_lengths():
    assert throughput_ratio("uniform") == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("workload", ["mixed", "heavy-mixed"])
def test_large_gain_on_mixed_lengths(workload):
    assert throughput_ratio(workload) > 1.4


def test_static_reserves_more_kv_than_continuous_uses():
    wl = load_workload("mixed", seed=0, num_requests=16)
    s = {
        k: simulate(wl.requests, config(k, 8)).summary()
        for k in ("static", "dynamic", "continuous")
    }
    assert (
        s["static"]["kv_reserved_unused_tokens_mean"]
        > s["dynamic"]["kv_reserved_unused_tokens_mean"]
    )
    assert (
        s["dynamic"]["kv_reserved_unused_tokens_mean"]
        > s["continuous"]["kv_reserved_unused_tokens_mean"]
    )
    assert s["static"]["kv_usage_mean"] > s["continuous"]["kv_usage_mean"]


def test_open_loop_arrivals_idle_the_clock_and_are_deterministic():
    wl = with_arrivals(load_workload("chat", seed=1, num_requests=20), "poisson", rate=2.0, seed=1)
    a = simulate(wl.requests, config("continuous", 8))
    b = simulate(wl.requests, config("continuous", 8))
    assert [r.token_times_s for r in a.requests] == [r.token_times_s for r in b.requests]
    for spec, r in zip(wl.requests, a.requests, strict=True):
        assert r.arrival_s == spec.arrival_s and r.first_scheduled_s >= r.arrival_s
        assert len(r.token_times_s) == spec.output_len
    # light load: the run lasts about as long as the arrivals take
    assert a.duration_s >= max(s.arrival_s for s in wl.requests)


def test_prefix_ids_share_prompt_blocks_and_hit_the_cache():
    specs = [RequestSpec(i, 1100, 4, arrival_s=float(i), prefix_ids=(7, 8)) for i in range(3)]
    assert prompt_tokens(specs[0], 1000, 512)[:1024] == prompt_tokens(specs[1], 1000, 512)[:1024]
    assert prompt_tokens(specs[0], 1000, 512)[1024:] != prompt_tokens(specs[1], 1000, 512)[1024:]
    res = simulate(
        specs, config("continuous", 4, enable_prefix_caching=True), prefix_block_size=512
    )
    assert [r.num_cached_tokens for r in res.requests] == [0, 1024, 1024]


def test_requests_too_long_for_the_model_are_named():
    specs = [RequestSpec(0, 100, 10), RequestSpec(1, 2000, 100)]
    with pytest.raises(EngineError, match="workload request 1: .*exceeds max_model_len"):
        simulate(specs, config("continuous", 4, model="tiny"))


def test_interleaved_replay_equals_separate_runs():
    wl = load_workload("mixed", seed=3, num_requests=12)
    cfgs = [config(s, 4) for s in ("static", "dynamic", "continuous")]
    together = replay_interleaved(wl.requests, cfgs)
    for cfg, res in zip(cfgs, together, strict=True):
        alone = simulate(wl.requests, cfg)
        assert [r.token_times_s for r in res.requests] == [r.token_times_s for r in alone.requests]
        assert len(res.steps) == len(alone.steps)
