"""`--max-num-seqs auto`: the adaptive running limit (scheduler/adaptive_limit.py) alone, in
the continuous scheduler on the simulator (against fixed limits on a KV-bound workload,
deterministic), through the flags, and its gauge and counter in /metrics over real HTTP."""

from __future__ import annotations

import argparse
import asyncio
import random

import httpx
import openai
import pytest
from cbbench.reference_engine.config.engine_config import ContinuousConfig, EngineConfig
from cbbench.reference_engine.config.options import (
    SIM_DEFAULTS,
    add_engine_args,
    build_engine_config,
    engine_argv,
    engine_config_from_args,
    engine_settings,
)
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.sampling_params import SamplingParams
from cbbench.reference_engine.scheduler.adaptive_limit import AdaptiveLimit
from cbbench.reference_engine.sim.simulate import simulate
from cbbench.workloads import load_workload
from engine_sched_support import Req, drive, sim_engine
from hypothesis import given, settings
from hypothesis import strategies as st
from server_support import scrape, serve


def add(engine, rid: str, prompt_len: int, max_tokens: int) -> None:
    engine.add_request(
        rid, [3] * prompt_len, SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    )


# --- the controller alone -------------------------------------------------------------
readings = st.lists(
    st.tuples(st.floats(0.0, 1.0), st.integers(0, 3), st.integers(0, 50), st.integers(0, 300)),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(ceiling=st.integers(1, 256), steps=readings, cooldown=st.integers(0, 10))
def test_the_limit_stays_within_1_and_the_ceiling(ceiling, steps, cooldown):
    a = AdaptiveLimit(ceiling, cooldown_steps=cooldown)
    assert a.limit == ceiling  # starts at the ceiling: a fixed limit until the first signal
    moves = 0
    for kv, pre, waiting, running in steps:
        before = a.limit
        after = a.update(kv, pre, waiting, running)
        assert 1 <= after <= ceiling
        assert after == a.limit
        moves += after != before
        if after < before:
            assert pre or kv > a.high, "lowered only on a preemption or a full pool"
        if after > before:
            assert kv < a.low and waiting and running >= before, "raised only when it binds"
    assert a.num_up + a.num_down == moves  # every move is one counted decision


def test_a_preemption_lowers_the_limit_from_the_running_count():
    a = AdaptiveLimit(64, cooldown_steps=0)
    assert a.update(0.5, 1, 10, 40) == int(40 * a.beta)  # cut below what overflowed
    assert (a.num_down, a.num_up) == (1, 0)
    assert a.update(0.99, 0, 10, 30) < int(40 * a.beta)  # a full pool lowers it too
    limit = a.limit
    for _ in range(50):  # repeated overflows: down to 1, never below
        a.update(1.0, 2, 10, 100)
    assert a.limit == 1 < limit


def test_free_kv_and_waiting_requests_raise_it_up_to_the_ceiling_only():
    a = AdaptiveLimit(64, cooldown_steps=0)
    a.update(0.5, 1, 10, 20)  # 20 * 0.85 -> 17
    assert a.limit == 17
    assert a.update(0.5, 0, 0, 17) == 17, "nobody waits: no reason to raise"
    assert a.update(0.5, 0, 10, 12) == 17, "the batch is under the limit: raising is moot"
    assert a.update(0.95, 0, 10, 17) == 17, "KV between the marks: hold"
    assert a.update(0.5, 0, 10, 17) == 17 + a.step
    for _ in range(100):
        a.update(0.1, 0, 10, a.limit)
    assert a.limit == 64 and a.num_up >= 1


def test_the_cooldown_holds_the_limit_after_a_decision():
    a = AdaptiveLimit(64, cooldown_steps=3)
    a.update(0.5, 1, 10, 40)
    cut = a.limit
    for _ in range(3):  # the batch cannot have followed yet: preemptions here are ignored
        assert a.update(1.0, 1, 10, 40) == cut
    assert a.update(1.0, 1, 10, 40) < cut


# --- in the scheduler -----------------------------------------------------------------
def test_a_lowered_limit_preempts_nobody_and_admission_waits_under_it():
    e = sim_engine(num_kv_blocks=256, continuous={"max_num_seqs": 8, "adaptive_num_seqs": True})
    for i in range(6):
        add(e, f"r{i}", prompt_len=8, max_tokens=30)
    e.step()
    assert e.scheduler.num_running == 6
    lim = e.scheduler.adaptive
    lim.limit, lim._cooldown = 2, 10**6  # as if it had cut to 2 (and holds it)
    add(e, "late", prompt_len=8, max_tokens=4)
    running = [e.scheduler.num_running]
    while "late" not in e.last_scheduled:
        e.step()
        e.check_invariants()
        running.append(e.scheduler.num_running)
    assert e.get_stats().num_preempted_total == 0
    assert max(running[:-1]) == 6 and running[-2] < 2, "admitted once running fell under 2"
    assert e.get_stats().num_seqs_limit == 2


def test_a_fixed_limit_reports_itself_and_no_decisions():
    e = sim_engine(continuous={"max_num_seqs": 5})
    drive(e, [Req(f"r{i}", [3] * 8, 6) for i in range(9)])
    s = e.get_stats()
    assert (s.num_seqs_limit, s.num_seqs_limit_ups, s.num_seqs_limit_downs) == (5, 0, 0)
    assert e.scheduler.adaptive is None


def test_the_limit_moves_on_a_small_kv_bound_pool_and_outputs_stay_the_same():
    reqs = [Req(f"r{i}", [5 + i] * 12, 24) for i in range(12)]
    auto = sim_engine(num_kv_blocks=24, continuous={"max_num_seqs": 12, "adaptive_num_seqs": True})
    fixed = sim_engine(num_kv_blocks=24, continuous={"max_num_seqs": 12})
    t_auto, t_fixed = drive(auto, reqs), drive(fixed, reqs)  # drive checks the invariants
    assert t_auto.outputs == t_fixed.outputs  # the limit changes when, never what
    s = auto.get_stats()
    assert s.num_seqs_limit_downs >= 1
    assert sum(t_auto.preemptions.values()) < sum(t_fixed.preemptions.values())


@settings(max_examples=25, deadline=None)
@given(
    lens=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 30)), min_size=1, max_size=16),
    blocks=st.integers(16, 40),  # a request (<= 60 tokens, 4 a block) always fits alone
    ceiling=st.integers(1, 16),
)
def test_any_workload_finishes_with_the_invariants_and_the_fixed_outputs(lens, blocks, ceiling):
    reqs = [Req(f"r{i}", [5 + i] * p, n) for i, (p, n) in enumerate(lens)]
    kw = {"num_kv_blocks": blocks, "max_model_len": 64}
    auto = sim_engine(**kw, continuous={"max_num_seqs": ceiling, "adaptive_num_seqs": True})
    t = drive(auto, reqs)  # checks the engine's invariants after every step
    assert t.outputs == drive(sim_engine(**kw, continuous={"max_num_seqs": ceiling}), reqs).outputs
    assert all(len(t.outputs[r.rid]) == r.max_tokens for r in reqs)
    assert 1 <= auto.get_stats().num_seqs_limit <= ceiling


def _run(max_num_seqs, gb: float = 2.0):
    wl = load_workload("mixed", seed=0, num_requests=60)
    cfg = build_engine_config(
        {"max_num_seqs": max_num_seqs, "kv_cache_memory_gb": gb, "scheduler": "continuous"},
        SIM_DEFAULTS,
    )
    res = simulate(wl.requests, cfg, prefix_block_size=wl.prefix_block_size, seed=wl.seed)
    return res.summary()


def test_on_a_kv_bound_mixed_workload_auto_beats_both_wrong_fixed_limits():
    """SIMULATED (llama-3-8b on h100-sxm, 2 GiB of KV, 60 mixed requests): a limit of 128
    overfills the pool and preempts, one of 8 leaves it idle; auto does neither."""
    high, low, auto = _run(128), _run(8), _run("auto:128")
    assert high["num_preemptions"] > 0 and low["num_preemptions"] == 0
    assert auto["num_preemptions"] <= 0.6 * high["num_preemptions"], (auto, high)
    assert auto["output_throughput"] >= 0.95 * high["output_throughput"]
    assert auto["output_throughput"] >= 1.5 * low["output_throughput"]
    assert low["kv_usage_mean"] < auto["kv_usage_mean"]
    assert 1 <= auto["num_seqs_limit_mean"] < 128
    assert high["num_seqs_limit_mean"] == 128


# --- the flag -------------------------------------------------------------------------
def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_engine_args(p)
    return p.parse_args(list(argv))


def test_the_flag_takes_n_auto_and_auto_n():
    c = engine_config_from_args(_parse("--max-num-seqs", "24")).continuous
    assert (c.max_num_seqs, c.adaptive_num_seqs) == (24, False)
    c = engine_config_from_args(_parse("--max-num-seqs", "auto")).continuous
    assert (c.max_num_seqs, c.adaptive_num_seqs) == (ContinuousConfig.max_num_seqs, True)
    c = engine_config_from_args(_parse("--max-num-seqs", "auto", "--batch-size", "12"))
    assert (c.continuous.max_num_seqs, c.continuous.adaptive_num_seqs) == (12, True)  # B
    assert c.max_batch_slots == 12  # what graph sizes and batch occupancy read
    ns = _parse("--max-num-seqs", "auto:300")
    c = engine_config_from_args(ns).continuous
    assert (c.max_num_seqs, c.adaptive_num_seqs, c.max_num_batched_tokens) == (300, True, 2048)
    assert engine_argv(engine_settings(ns)) == ["--max-num-seqs", "auto:300"]  # serve child


def test_a_bad_value_is_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        _parse("--max-num-seqs", "sometimes")
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--max-num-seqs: expected an integer, auto or auto:N, got 'sometimes'" in err
    with pytest.raises(EngineError, match="expected an integer, auto or auto:N, got 'auto:x'"):
        build_engine_config({"max_num_seqs": "auto:x"})
    with pytest.raises(EngineError, match="max_num_seqs must be >= 1, got 0"):
        build_engine_config({"max_num_seqs": "auto:0"})


def test_random_flag_round_trips():
    rng = random.Random(0)
    for _ in range(20):
        value = rng.choice(["auto", f"auto:{rng.randint(1, 512)}", rng.randint(1, 512)])
        ns = _parse(*engine_argv({"max_num_seqs": value}))
        assert engine_settings(ns) == {"max_num_seqs": value}


# --- /metrics over real HTTP ----------------------------------------------------------
def test_limit_gauge_and_decision_counter_move_under_a_kv_bound_load():
    """The tiny model on a 24-block pool (16 tokens a block), 16 concurrent requests of
    ~40 tokens each through the openai client: the pool overflows, the limit comes down."""
    cfg = EngineConfig(
        model="tiny", num_kv_blocks=24, max_model_len=128,
        continuous=ContinuousConfig(max_num_seqs=16, adaptive_num_seqs=True),
    )  # fmt: skip
    with serve(cfg) as (url, _):
        before = scrape(url)
        assert before["cbbench:max_num_seqs_changes_total{direction=up}"] == 0
        assert before["cbbench:max_num_seqs_changes_total{direction=down}"] == 0
        assert before["cbbench:max_num_seqs_limit"] == 16  # the ceiling, before any step

        async def main() -> list[int]:
            async with httpx.AsyncClient(timeout=120) as http:
                client = openai.AsyncOpenAI(
                    base_url=url + "/v1", api_key="x", http_client=http, max_retries=0
                )

                async def one(i: int) -> int:
                    r = await client.completions.create(
                        model="tiny", prompt=[3 + i] * 24, max_tokens=20, temperature=0,
                        extra_body={"ignore_eos": True},
                    )  # fmt: skip
                    return r.usage.completion_tokens

                return await asyncio.gather(*(one(i) for i in range(16)))

        assert asyncio.run(main()) == [20] * 16
        after = scrape(url)
    assert after["vllm:num_preemptions_total"] > 0  # the load was KV-bound
    assert after["cbbench:max_num_seqs_changes_total{direction=down}"] >= 1
    assert 1 <= after["cbbench:max_num_seqs_limit"] < 16
