"""The seeds' figure: outputs [10, 5, 8, 3, 12, 6] with B = 4, one step per token."""

from __future__ import annotations

import pytest
from engine_sched_support import Req, drive, sim_engine

OUTPUTS = [10, 5, 8, 3, 12, 6]


def seed_demo(scheduler: str):
    engine = sim_engine(
        scheduler,
        static={"batch_size": 4},
        dynamic={"max_batch_size": 4},
        continuous={"max_num_seqs": 4, "max_num_batched_tokens": 256},
    )
    reqs = [Req(f"r{i}", [7 + i] * 32, n) for i, n in enumerate(OUTPUTS)]
    return engine, drive(engine, reqs)


@pytest.mark.parametrize(
    ("scheduler", "steps"), [("static", 22), ("dynamic", 22), ("continuous", 15)]
)
def test_seed_demo_step_counts(scheduler, steps):
    engine, trace = seed_demo(scheduler)
    assert len(trace.steps) == steps
    assert engine.now() == steps
    assert {rid: len(t) for rid, t in trace.outputs.items()} == {
        f"r{i}": n for i, n in enumerate(OUTPUTS)
    }
    assert set(trace.finish.values()) == {"length"}
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_static_batches_run_to_completion_with_idle_slots():
    _, trace = seed_demo("static")
    assert trace.steps[0] == ["r0", "r1", "r2", "r3"]
    assert trace.steps[3] == ["r0", "r1", "r2"]  # r3 (3 tokens) finished: its slot idles
    assert all(set(s) <= {"r0", "r1", "r2", "r3"} for s in trace.steps[:10])
    assert trace.steps[10] == ["r4", "r5"]  # second batch only after the first ends
    assert trace.first_scheduled["r4"] == 10.0


def test_continuous_refills_a_free_slot_in_the_next_step():
    _, trace = seed_demo("continuous")
    assert trace.steps[2] == ["r0", "r1", "r2", "r3"]  # r3's last token in step 3
    assert "r4" in trace.steps[3] and "r3" not in trace.steps[3]
    assert trace.first_scheduled["r4"] == 3.0
    assert trace.first_scheduled["r5"] == 5.0  # r1 (5 tokens) ends in step 5
    # no slot idles while requests wait
    for i, s in enumerate(trace.steps):
        waiting = [r for r, t in trace.first_scheduled.items() if t > i]
        assert len(s) == 4 or not waiting
