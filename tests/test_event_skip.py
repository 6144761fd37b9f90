"""Event-skipping simulation (sim/event_skip.py) against the step-by-step path, its oracle:
seeded random workloads through every scheduler and feature give the same per-request times
(within floating-point tolerance), the same tokens and the same step count, and the windows
really skip (a path that never skipped would pass the equality trivially). Features that
cannot skip say so and fall back to stepping."""

from __future__ import annotations

import random

import pytest
from cbbench.reference_engine.config.options import SIM_DEFAULTS, build_engine_config
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.execution.cost_model import HARDWARE_PRESETS, CostModel, HardwareSpec
from cbbench.reference_engine.router.cluster_sim import simulate_cluster
from cbbench.reference_engine.router.registry import POLICY_NAMES, make_policy
from cbbench.reference_engine.sim.event_skip import decode_step_time, skip_blockers
from cbbench.reference_engine.sim.simulate import simulate
from cbbench.workloads.spec import RequestSpec


def workload(seed: int, n: int = 120, rate: float = 40.0, prefixes: bool = False):
    """Random prompts and outputs, Poisson arrivals with a burst at the start."""
    rng = random.Random(seed)
    t, reqs = 0.0, []
    for i in range(n):
        if i >= n // 4:
            t += rng.expovariate(rate)
        prefix = (rng.randrange(3),) if prefixes else ()
        reqs.append(RequestSpec(i, rng.randint(8, 300), rng.randint(1, 200), arrival_s=t,
                                priority=rng.randrange(3), prefix_ids=prefix))  # fmt: skip
    return reqs


def cfg(scheduler: str, **kw):
    return build_engine_config(kw, SIM_DEFAULTS, scheduler=scheduler)


def assert_same(a, b):
    assert len(a.steps) == len(b.steps)
    for ra, rb in zip(a.requests, b.requests, strict=True):
        assert rb.output_token_ids == ra.output_token_ids, ra.request_id
        assert rb.token_times_s == pytest.approx(ra.token_times_s, rel=1e-9, abs=1e-12)
        for f in ("first_scheduled_s", "first_token_s", "finished_s"):
            assert getattr(rb, f) == pytest.approx(getattr(ra, f), rel=1e-9, abs=1e-12)
        assert (rb.num_preemptions, rb.num_cached_tokens) == (ra.num_preemptions,
                                                              ra.num_cached_tokens)  # fmt: skip
    sa, sb = a.summary(), b.summary()
    for key in ("num_steps", "num_preemptions", "total_output_tokens", "prefix_cache_hit_rate"):
        assert sb[key] == sa[key], key
    for key in ("kv_usage_mean", "batch_occupancy_mean", "kv_reserved_unused_tokens_mean"):
        assert sb[key] == pytest.approx(sa[key], rel=1e-9), key
    for x, y in zip(a.steps, b.steps, strict=True):  # every step's record
        assert (y.num_seqs, y.num_running, y.num_waiting, y.kv_blocks_used) == (
            x.num_seqs,
            x.num_running,
            x.num_waiting,
            x.kv_blocks_used,
        ), x.index
        assert y.kv_reserved_unused_tokens == x.kv_reserved_unused_tokens, x.index
        if x.step_gap_s is None:  # after idling
            assert y.step_gap_s is None, x.index
        else:
            assert y.step_gap_s == pytest.approx(x.step_gap_s, rel=1e-9), x.index
        assert (y.start_s, y.end_s) == pytest.approx((x.start_s, x.end_s), rel=1e-9, abs=1e-12)


CASES = {
    "continuous": ("continuous", {}),
    "continuous-preemption": ("continuous", {"num_kv_blocks": 90, "max_num_seqs": 16}),
    "continuous-chunked": (
        "continuous",
        {"max_num_batched_tokens": 64, "enable_chunked_prefill": True},
    ),  # fmt: skip
    "continuous-prefix-caching": ("continuous", {"enable_prefix_caching": True}),
    "continuous-priority": (
        "continuous",
        {"policy": "priority", "aging_rate": 2.0, "max_num_seqs": 8},
    ),  # fmt: skip
    "continuous-max-queue-wait": ("continuous", {"max_queue_wait": 0.05, "max_num_seqs": 8}),
    "continuous-calibrated-cpu": ("continuous", {"hardware": "cpu-measured", "model": "tiny"}),
    "static": ("static", {"batch_size": 8}),
    "dynamic": ("dynamic", {"batch_size": 8}),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_skipping_equals_stepping(case, seed):
    scheduler, kw = CASES[case]
    c = cfg(scheduler, **kw)
    reqs = workload(seed, prefixes="prefix" in case)
    stepped = simulate(reqs, c)
    skipped = simulate(reqs, c, event_skip=True)
    assert stepped.skipped_steps == 0
    # a KV-bound pool leaves requests waiting with slots free: an admission may come at any
    # step, so only stretches without one skip
    # (so does a queue that `max_queue_wait` may force in)
    share = 0.02 if "preemption" in case or "queue-wait" in case else 0.2
    assert skipped.skipped_steps > share * len(skipped.steps), "hardly anything was skipped"
    assert_same(stepped, skipped)
    if "preemption" in case:
        assert stepped.summary()["num_preemptions"] > 0


@pytest.mark.parametrize(
    "kw,why",
    [
        ({"speculative_method": "ngram", "num_speculative_tokens": 3}, "speculative decoding"),
        ({"async_scheduling": True}, "async scheduling"),
        ({"max_num_seqs": "auto"}, "--max-num-seqs auto"),
    ],
)
def test_features_that_cannot_skip_fall_back_to_stepping(kw, why):
    c = cfg("continuous", **kw)
    assert any(why in b for b in skip_blockers(LLMEngine.from_config(c)))
    reqs = workload(3, n=40)
    stepped, skipped = simulate(reqs, c), simulate(reqs, c, event_skip=True)
    assert skipped.skipped_steps == 0
    assert_same(stepped, skipped)


def _cluster_same(a, b):
    assert [r.replica for r in a.requests] == [r.replica for r in b.requests]
    for ra, rb in zip(a.requests, b.requests, strict=True):
        assert rb.num_tokens == ra.num_tokens
        assert (rb.num_cached_tokens, rb.num_preemptions) == (ra.num_cached_tokens,
                                                              ra.num_preemptions)  # fmt: skip
        for f in ("first_scheduled_s", "first_token_s", "finished_s"):
            assert getattr(rb, f) == pytest.approx(getattr(ra, f), rel=1e-9, abs=1e-12)
    assert [t.steps for t in a.replicas] == [t.steps for t in b.replicas]
    for ta, tb in zip(a.replicas, b.replicas, strict=True):
        assert tb.busy_s == pytest.approx(ta.busy_s, rel=1e-9)
        assert tb.load_time == pytest.approx(ta.load_time, rel=1e-9)
        assert tb.kv_time == pytest.approx(ta.kv_time, rel=1e-9)


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("scheduler", ["continuous", "static"])
def test_router_cluster_skipping_equals_stepping(policy, scheduler):
    reqs = workload(7, n=200, rate=150.0, prefixes=True)
    c = cfg(scheduler, enable_prefix_caching=True, batch_size=16)
    a = simulate_cluster(reqs, c, 4, make_policy(policy))
    b = simulate_cluster(reqs, c, 4, make_policy(policy), event_skip=True)
    assert a.skipped_steps == 0 and b.skipped_steps > 0
    _cluster_same(a, b)
    # a policy that reads only outstanding counts lets replicas decode behind arrivals
    # routed elsewhere (sim/quiet.py); kv-aware reads every replica's KV usage (static
    # batches of 16 form only once every request has arrived here)
    if scheduler == "continuous":
        assert (b.caught_up > 0) == (not make_policy(policy).reads_engine_stats)


@pytest.mark.parametrize(
    "hardware,kw",
    [
        ("h100-sxm", {"scheduler": "static", "batch_size": 4}),
        ("h100-sxm", {"scheduler": "dynamic", "batch_size": 4}),
        ("h100-sxm", {"num_kv_blocks": 150, "max_num_seqs": 24}),  # the pool preempts
        ("h100-sxm", {"enable_chunked_prefill": True, "max_num_batched_tokens": 96}),
        ("cpu-measured", {"model": "tiny"}),  # prices the KV layout: never left behind
        ("steps", {"rate": 3.0}),  # a step is a second
    ],
)
def test_replicas_left_behind_arrivals_equal_stepping(hardware, kw):
    """Steady arrivals over 6 replicas: a replica decoding without a completion ahead waits
    behind arrivals routed elsewhere and catches up when one is routed to it; every
    request's times and every replica's sums are the stepping path's."""
    kw = dict(kw)
    reqs = workload(13, n=260, rate=kw.pop("rate", 220.0))
    c = cfg(kw.pop("scheduler", "continuous"), hardware=hardware, **kw)
    a = simulate_cluster(reqs, c, 6, make_policy("least-outstanding"))
    b = simulate_cluster(reqs, c, 6, make_policy("least-outstanding"), event_skip=True)
    _cluster_same(a, b)
    assert b.skipped_steps > 0
    if "num_kv_blocks" in kw:
        assert a.summary()["num_preemptions"] > 0
    assert (b.caught_up > 0) == (hardware != "cpu-measured")


def test_router_sessions_and_preemption():
    """Multi-turn sessions (a reply sends the next turn) and a pool small enough to preempt."""
    from cbbench.workloads.loader import build_from_spec

    spec = {
        "prompt": {"dist": "uniform", "min": 50, "max": 400},
        "output": {"dist": "uniform", "min": 5, "max": 120},
        "session": {
            "turns": {"dist": "constant", "value": 3},
            "think_ms": {"dist": "constant", "value": 10},
            "message": {"dist": "constant", "value": 20},
        },
    }
    reqs = build_from_spec(spec, "sessions", "spec", seed=5, num_requests=48).requests
    c = cfg("continuous", enable_prefix_caching=True, num_kv_blocks=120, max_num_seqs=12)
    a = simulate_cluster(reqs, c, 2, make_policy("prefix-affinity"))
    b = simulate_cluster(reqs, c, 2, make_policy("prefix-affinity"), event_skip=True)
    assert b.skipped_steps > 0 and a.summary()["num_preemptions"] > 0
    _cluster_same(a, b)


LINEAR = HardwareSpec("linear", 1.0, 1.0, 1.0, linear={
    "c0": 3e-3, "c_host": 1e-4, "c_tok": 2e-4, "c_sample": 1e-5, "c_seq": 3e-6, "c_flops": 1e-13,
    "c_bytes": 1e-12, "c_dec_ctx": 2e-7, "c_dec_gathered": 1e-7, "c_dec_calls": 4e-5,
})  # fmt: skip


@pytest.mark.parametrize("hardware", ["h100", "a100", "steps", "linear"])
def test_decode_step_time_is_the_cost_models(hardware):
    """The closed-form decode step time against CostModel.work + time_of."""
    from cbbench.reference_engine.model.config import resolve_model_config

    mc = resolve_model_config("llama-3-8b")
    hw = LINEAR if hardware == "linear" else HARDWARE_PRESETS[
        {"h100": "h100-sxm", "a100": "a100-80g"}.get(hardware, hardware)]  # fmt: skip
    cm = CostModel(mc, hw, "bfloat16")
    rng = random.Random(0)
    for _ in range(50):
        ends = [rng.randint(1, 4000) for _ in range(rng.randint(1, 64))]
        want = cm.time_of(cm.work((e - 1, 1, True) for e in ends))
        got, _ = decode_step_time(cm, len(ends), sum(ends), max(ends))
        assert got == pytest.approx(want, rel=1e-12)


def test_reproduce_padded_static_and_jobs_equal_the_stepping_path():
    """reproduce --sim-only's pair on the skipping path (the padded static batch priced by
    its decode_time) against plain stepping, and --jobs 2 against one process."""
    from cbbench.harness.studies import reproduce as rp
    from cbbench.harness.studies import reproduce_jobs as rj
    from cbbench.reference_engine.sim.simulate import replay

    s = rp.Setting(num_requests=120, replicates=2)
    stepped = rp.run_pair("mixed", s, replay_fn=replay)
    skipped = rp.run_pair("mixed", s)
    for a, b in zip(stepped["results"], skipped["results"], strict=True):
        assert b.skipped_steps > 0.5 * len(b.steps)
        assert len(a.steps) == len(b.steps)
        for ra, rb in zip(a.requests, b.requests, strict=True):
            assert rb.token_times_s == pytest.approx(ra.token_times_s, rel=1e-9, abs=1e-12)
    assert skipped["gain_req_s"] == pytest.approx(stepped["gain_req_s"], rel=1e-9)
    one, two = rj.run_replicates("mixed", s), rj.run_replicates("mixed", s, jobs=2)
    assert two["gain_req_s"] == one["gain_req_s"] and two["seeds"] == one["seeds"]


def test_router_chunked_prefill_with_a_one_token_last_chunk():
    """A prompt whose last chunk is one token looks like a decode (one token to compute) but
    has no first token yet: it must be the scheduler's step, not a window's."""
    reqs = workload(11, n=300, rate=400.0)
    c = cfg("continuous", max_num_batched_tokens=37, enable_chunked_prefill=True, batch_size=8)
    a = simulate_cluster(reqs, c, 8, make_policy("least-outstanding"))
    b = simulate_cluster(reqs, c, 8, make_policy("least-outstanding"), event_skip=True)
    assert b.skipped_steps > 0
    _cluster_same(a, b)
