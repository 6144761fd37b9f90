"""Scheduler semantics on the simulated executor (one virtual time unit per step)."""

from __future__ import annotations

import pytest
from cbbench.reference_engine.errors import EngineError, QueueFullError
from cbbench.reference_engine.sampling_params import SamplingParams
from engine_sched_support import Req, drive, sim_engine


def add(engine, rid, prompt_len=8, max_tokens=4, **kw):
    params = SamplingParams(
        max_tokens=max_tokens, ignore_eos=kw.pop("ignore_eos", True), **kw.pop("params", {})
    )
    engine.add_request(rid, [3] * prompt_len, params, **kw)


# --- static ---------------------------------------------------------------------------
def test_static_waits_for_b_then_drains_a_partial_batch_after_the_timeout():
    e = sim_engine("static", static={"batch_size": 4, "drain_timeout_s": 5.0})
    for i in range(3):
        add(e, f"r{i}", arrival_time=0.0)
    assert e.step() == [] and e.get_stats().num_running == 0
    assert e.next_wakeup() == 5.0
    e.executor.advance_to(5.0)
    e.step()
    assert e.last_scheduled == ["r0", "r1", "r2"]


def test_static_reserves_max_model_len_per_slot():
    e = sim_engine("static", static={"batch_size": 2}, max_model_len=64, block_size=4)
    add(e, "a", prompt_len=8, max_tokens=4)
    add(e, "b", prompt_len=8, max_tokens=4)
    e.step()
    s = e.get_stats()
    assert s.kv_blocks_used == 2 * 16
    assert s.kv_reserved_unused_tokens == 2 * (64 - 8)
    assert s.batch_occupancy == 1.0


def test_static_batch_that_cannot_be_reserved_is_a_config_error():
    with pytest.raises(EngineError, match="batch_size 8 needs 256 KV blocks but the pool has 100"):
        sim_engine("static", static={"batch_size": 8}, max_model_len=128, num_kv_blocks=100)


# --- dynamic --------------------------------------------------------------------------
def test_dynamic_takes_the_largest_fillable_preferred_size():
    e = sim_engine(
        "dynamic",
        dynamic={"max_batch_size": 4, "preferred_batch_sizes": (2, 4), "max_queue_delay_s": 3.0},
    )
    for i in range(3):
        add(e, f"r{i}", max_tokens=2, arrival_time=0.0)
    e.step()
    assert e.last_scheduled == ["r0", "r1"]  # 3 waiting: preferred 2, not 3
    e.step()
    assert e.get_stats().num_running == 0  # the batch (2 tokens each) ended
    assert e.step() == [] and e.next_wakeup() == 3.0  # 1 waiting < 2: wait for the delay
    e.executor.advance_to(3.0)
    e.step()
    assert e.last_scheduled == ["r2"]


def test_dynamic_reserves_prompt_plus_max_tokens():
    e = sim_engine("dynamic", dynamic={"max_batch_size": 2, "max_queue_delay_s": 0.0})
    add(e, "a", prompt_len=10, max_tokens=7)  # 17 tokens -> 5 blocks of 4
    add(e, "b", prompt_len=3, max_tokens=1)  # 4 tokens -> 1 block
    e.step()
    assert e.get_stats().kv_blocks_used == 6


def test_dynamic_queue_limit_rejects():
    e = sim_engine("dynamic", dynamic={"max_batch_size": 2, "max_queue_size": 2})
    add(e, "a")
    add(e, "b")
    with pytest.raises(QueueFullError, match="waiting queue is full"):
        add(e, "c")
    assert "c" not in e.seqs


def test_max_waiting_rejects_under_any_policy():
    e = sim_engine("continuous", max_waiting=1)
    add(e, "a")
    with pytest.raises(QueueFullError):
        add(e, "b")


# --- request validation ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("prompt", "max_tokens", "match"),
    [
        ([], 4, "empty prompt"),
        ([1] * 100, 40, "exceeds max_model_len"),
        ([600], 4, r"token ids must lie in \[0, 512\)"),
    ],
)
def test_bad_requests_are_engine_errors(prompt, max_tokens, match):
    e = sim_engine()
    with pytest.raises(EngineError, match=match):
        e.add_request("x", prompt, SamplingParams(max_tokens=max_tokens))


def test_duplicate_id_and_request_larger_than_the_pool():
    e = sim_engine(num_kv_blocks=4, block_size=4)
    add(e, "a", prompt_len=8, max_tokens=4)
    with pytest.raises(EngineError, match="already in use"):
        add(e, "a")
    with pytest.raises(EngineError, match="need 5 KV blocks but the pool has 4"):
        add(e, "b", prompt_len=16, max_tokens=4)


# --- continuous ------------------------------------------------------------------------
def test_chunked_prefill_splits_a_long_prompt_within_the_budget():
    e = sim_engine(continuous={"max_num_seqs": 4, "max_num_batched_tokens": 16})
    add(e, "a", prompt_len=40, max_tokens=3)
    sizes = []
    while e.has_unfinished_requests():
        outs = e.step()
        sizes.append((e.get_stats().num_batched_tokens, len(outs)))
    assert sizes == [(16, 0), (16, 0), (8, 1), (1, 1), (1, 1)]


def test_decodes_come_before_new_prefills_in_the_budget():
    e = sim_engine(continuous={"max_num_seqs": 4, "max_num_batched_tokens": 10})
    add(e, "a", prompt_len=4, max_tokens=5)
    e.step()
    add(e, "b", prompt_len=30, max_tokens=2, arrival_time=e.now())
    e.step()
    assert e.last_scheduled == ["a", "b"] and e.get_stats().num_batched_tokens == 10


def test_without_chunked_prefill_the_budget_must_cover_max_model_len():
    with pytest.raises(EngineError, match="without chunked prefill"):
        sim_engine(
            continuous={"enable_chunked_prefill": False, "max_num_batched_tokens": 64},
            max_model_len=128,
        )
    e = sim_engine(
        continuous={"enable_chunked_prefill": False, "max_num_batched_tokens": 128},
        max_model_len=128,
    )
    add(e, "a", prompt_len=100, max_tokens=2)
    add(e, "b", prompt_len=100, max_tokens=2)
    e.step()
    assert e.last_scheduled == ["a"]  # b's whole prompt does not fit the rest of the budget
    e.step()
    assert e.last_scheduled == ["a", "b"]


def test_max_prefills_per_step_caps_admissions():
    e = sim_engine(continuous={"max_prefills_per_step": 1})
    for i in range(3):
        add(e, f"r{i}", max_tokens=5)
    seen = []
    for _ in range(3):
        e.step()
        seen.append(list(e.last_scheduled))
    assert seen == [["r0"], ["r0", "r1"], ["r0", "r1", "r2"]]


def test_preemption_by_recompute_keeps_the_tokens():
    reqs = [Req(f"r{i}", [5 + i] * 10, 20) for i in range(4)]
    small = sim_engine(num_kv_blocks=12, block_size=4, continuous={"watermark": 0.0})
    t_small = drive(small, reqs)
    t_big = drive(sim_engine(num_kv_blocks=256), reqs)
    assert sum(t_small.preemptions.values()) > 0
    assert t_small.outputs == t_big.outputs
    assert small.get_stats().num_preempted_total == sum(t_small.preemptions.values())
    assert len(t_small.steps) > len(t_big.steps)  # recompute costs steps
    assert small.block_manager.num_free_blocks == 12


def test_preempted_request_recomputes_prompt_plus_outputs():
    e = sim_engine(num_kv_blocks=6, block_size=4, continuous={"watermark": 0.0})
    add(e, "a", prompt_len=8, max_tokens=12)  # grows to 5 blocks
    add(e, "b", prompt_len=8, max_tokens=12)
    e.step()  # both prefilled: 2 + 2 blocks, 2 free
    steps = 0
    while e.get_stats().num_preempted_total == 0:
        e.step()
        steps += 1
        assert steps < 20
    victim = e.seqs["b"]
    assert victim.num_computed_tokens == 0 and victim.block_table == []
    assert victim.num_output_tokens > 0
    known = victim.num_tokens  # prompt + the outputs it had: all to be recomputed
    while victim.num_computed_tokens == 0:
        e.step()
    assert victim.num_computed_tokens == known  # one recompute step, then a new token
    assert victim.num_tokens == known + 1


def test_priority_policy_admits_better_priority_first():
    e = sim_engine(
        continuous={"max_num_seqs": 1, "policy": "priority", "aging_rate": 0.0},
    )
    add(e, "low", priority=5, max_tokens=1)
    add(e, "high", priority=0, max_tokens=1)
    add(e, "mid", priority=2, max_tokens=1)
    order = []
    while e.has_unfinished_requests():
        e.step()
        order.extend(e.last_scheduled)
    assert order == ["high", "mid", "low"]


def stream_with_one_low_priority(aging_rate: float, n_high: int = 30) -> tuple[float, float]:
    """One slot; a priority-9 request at t=0, then a priority-0 one arriving every step."""
    reqs = [Req("low", [1] * 4, 2, priority=9)]
    reqs += [Req(f"h{i}", [2] * 4, 2, priority=0, arrival=float(i)) for i in range(n_high)]
    e = sim_engine(continuous={"max_num_seqs": 1, "policy": "priority", "aging_rate": aging_rate})
    t = drive(e, reqs)
    return t.first_scheduled["low"], max(t.first_scheduled.values())


def test_strict_priority_starves_and_aging_bounds_the_wait():
    starved, last = stream_with_one_low_priority(aging_rate=0.0)
    assert starved == last  # served after every high-priority request
    waited, _ = stream_with_one_low_priority(aging_rate=1.0)
    # priority gap 9 at 1 level/step: overtaken only by arrivals before t=9 (+ the one running)
    assert waited <= 9 * 2 + 2
    assert waited < starved


def test_max_queue_wait_forces_admission_by_preempting():
    e = sim_engine(
        continuous={
            "max_num_seqs": 2,
            "policy": "priority",
            "aging_rate": 0.0,
            "max_queue_wait_s": 3.0,
        }
    )
    add(e, "h0", priority=0, max_tokens=50, arrival_time=0.0)
    add(e, "h1", priority=0, max_tokens=50, arrival_time=0.0)
    add(e, "low", priority=9, max_tokens=2, arrival_time=0.0)
    for _ in range(3):
        e.step()
        assert "low" not in e.last_scheduled
    e.step()  # waited 3 steps: forced in, a running request preempted for its slot
    assert "low" in e.last_scheduled
    assert e.get_stats().num_preempted_total == 1
    assert e.seqs["h1"].metrics.num_preemptions == 1  # the least important (latest) one


def test_abort_frees_blocks_in_every_state():
    e = sim_engine(continuous={"max_num_seqs": 2, "max_num_batched_tokens": 8})
    add(e, "run", prompt_len=4, max_tokens=10)
    add(e, "prefill", prompt_len=20, max_tokens=10)  # chunked: mid-prefill after one step
    add(e, "wait", prompt_len=4, max_tokens=10)
    e.step()
    assert e.seqs["prefill"].num_computed_tokens == 4
    for rid in ("prefill", "wait", "run"):
        e.abort_request(rid)
        e.check_invariants()
    assert not e.has_unfinished_requests()
    assert e.block_manager.num_free_blocks == e.block_manager.num_blocks
    e.abort_request("unknown")  # ignored


def test_abort_in_a_static_batch_frees_at_once_and_the_slot_idles():
    e = sim_engine("static", static={"batch_size": 2}, max_model_len=32)
    add(e, "a", max_tokens=5)
    add(e, "b", max_tokens=5)
    e.step()
    used = e.block_manager.num_used_blocks
    e.abort_request("a")
    assert e.block_manager.num_used_blocks == used - 8
    e.step()
    assert e.last_scheduled == ["b"]
    assert e.get_stats().batch_occupancy == 0.5


def test_stop_conditions():
    e = sim_engine()
    e.executor.eos_probability = 0.5  # the simulator emits EOS (id 2) about every other token
    add(e, "eos", max_tokens=50, ignore_eos=False)
    add(e, "min", max_tokens=50, ignore_eos=False, params={"min_tokens": 20})
    add(e, "ign", max_tokens=30)
    finished = {}
    while e.has_unfinished_requests():
        for o in e.step():
            if o.finished:
                finished[o.request_id] = (o.finish_reason, o.num_output_tokens)
    assert finished["eos"][0] == "stop" and finished["eos"][1] < 20
    assert finished["min"][0] == "stop" and finished["min"][1] >= 20
    assert finished["ign"] == ("length", 30)


def test_stop_token_ids():
    e = sim_engine()
    tok = e.executor.token_for("s", 8 + 3)  # the 4th output token of a prompt of 8
    add(e, "s", max_tokens=10, params={"stop_token_ids": (tok,)})
    out = []
    while e.has_unfinished_requests():
        out += e.step()
    assert out[-1].finish_reason == "stop" and out[-1].new_token_ids == [tok]
    assert out[-1].num_output_tokens <= 4


def test_prefix_caching_skips_shared_blocks_and_keeps_tokens():
    shared = list(range(10, 42))  # 32 tokens = 8 blocks of 4
    reqs = [Req("a", [*shared, 1, 2], 3), Req("b", [*shared, 7], 3, arrival=10.0)]
    on = sim_engine(prefix_caching=True)
    t_on = drive(on, reqs)
    t_off = drive(sim_engine(prefix_caching=False), reqs)
    assert t_on.outputs == t_off.outputs
    assert on.block_manager.num_cached_blocks >= 8
    b_prefill = t_on.tokens_per_step[t_on.steps.index(["b"])]
    assert b_prefill == 1  # 33 tokens, 32 of them (8 full blocks) served from the cache
    assert on.block_manager.num_free_blocks == on.block_manager.num_blocks


def test_stats_fields():
    e = sim_engine(continuous={"max_num_seqs": 4})
    add(e, "a", prompt_len=6, max_tokens=3)
    add(e, "b", prompt_len=6, max_tokens=3)
    e.step()
    s = e.get_stats()
    assert (s.num_running, s.num_waiting) == (2, 0)
    assert s.num_batched_tokens == 12 and s.batch_occupancy == 0.5 and s.step_time_s == 1.0
    assert s.kv_blocks_used == 4 and s.kv_usage == 4 / 256
    assert s.kv_reserved_unused_tokens == 2 * (8 - 6)
    assert e.seqs["a"].metrics.first_token_time == 1.0
    assert e.seqs["a"].metrics.queue_time == 0.0


def test_first_scheduled_time_is_stamped_once_at_admission():
    e = sim_engine(num_kv_blocks=6, block_size=4, continuous={"watermark": 0.0})
    add(e, "a", prompt_len=8, max_tokens=12)
    add(e, "b", prompt_len=8, max_tokens=12)
    e.step()  # both admitted at engine time 0
    while e.get_stats().num_preempted_total == 0:
        e.step()
    victim = next(s for s in e.seqs.values() if s.metrics.num_preemptions)
    assert victim.metrics.first_scheduled_time == 0.0
    while victim.num_computed_tokens == 0:  # readmitted later: still its first admission
        e.step()
    assert victim.metrics.first_scheduled_time == 0.0 and e.now() > 1.0


def test_chunk_drafts_start_as_a_shared_list_that_refuses_changes():
    from cbbench.reference_engine.core.executor import ScheduledChunk

    e = sim_engine()
    add(e, "a")
    c, d = ScheduledChunk(e.seqs["a"], 8), ScheduledChunk(e.seqs["a"], 8)
    assert c.spec_token_ids == [] and c.num_scheduled_tokens == 8 and c.samples
    with pytest.raises(TypeError, match="assign a new list"):
        c.spec_token_ids.append(5)
    with pytest.raises(TypeError):
        c.spec_draft_probs += [1.0]
    c.spec_token_ids = [5, 6]  # what a proposer does
    assert d.spec_token_ids == [] and c.num_scheduled_tokens == 10
    assert e.seqs["a"].token_ids[:2] + c.spec_token_ids[:0] == [3, 3]
