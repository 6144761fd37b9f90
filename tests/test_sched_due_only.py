"""The continuous scheduler's due-only step (running_batch.py) decides exactly as the full
loop over every running sequence: same chunks, same preemptions, same block tables, on
random streams over tiny pools (preemption, chunked prefill, prefix caching, priority,
forced admissions, aborts, async scheduling); and at a steady decode it looks at the
sequences that cross a block boundary only."""

from __future__ import annotations

from cbbench.reference_engine.sampling_params import SamplingParams
from engine_sched_support import drive, sim_engine
from hypothesis import given
from test_engine_sched_properties import MAX_LEN, SETTINGS, continuous_cases


def _run(case, due_only: bool, async_scheduling: bool):
    reqs, cfg, num_blocks, prefix, aborts = case
    e = sim_engine(
        continuous=cfg,
        num_kv_blocks=num_blocks,
        max_model_len=MAX_LEN,
        prefix_caching=prefix,
        async_scheduling=async_scheduling,
    )
    if not due_only:
        e.scheduler._decide_due = lambda due, budget: None  # the full loop every step
    tables: list[dict[str, tuple[int, ...]]] = []
    step = e.step

    def traced():
        out = step()
        tables.append({rid: tuple(s.block_table) for rid, s in e.seqs.items()})
        return out

    e.step = traced
    return drive(e, reqs, aborts), tables


@SETTINGS
@given(continuous_cases())
def test_due_only_decides_as_the_full_loop(case):
    for async_scheduling in (False, True):
        fast, fast_tables = _run(case, True, async_scheduling)
        full, full_tables = _run(case, False, async_scheduling)
        assert fast.steps == full.steps
        assert fast.outputs == full.outputs and fast.finish == full.finish
        assert fast.preemptions == full.preemptions
        assert fast.first_scheduled == full.first_scheduled
        assert fast_tables == full_tables


def test_a_steady_decode_looks_at_block_crossings_only():
    bs, n = 4, 64
    e = sim_engine(
        num_kv_blocks=4096, block_size=bs, max_model_len=512,
        continuous={"max_num_seqs": n, "max_num_batched_tokens": 4096},
    )  # fmt: skip
    for i in range(n):  # prompts of 1..n tokens: block boundaries spread over the steps
        e.add_request(f"r{i}", [1] * (1 + i), SamplingParams(max_tokens=200, ignore_eos=True))
    sched = e.scheduler
    looked: list[int] = []
    decide = sched._decide_due

    def spy(due, budget):
        looked.append(len(due))
        return decide(due, budget)

    sched._decide_due = spy
    for _ in range(3 * bs):
        assert len(e.step()) == n
    e.check_invariants()
    # the prefill step took the full loop, every later one the due-only path
    assert len(looked) == 3 * bs - 1
    steady = looked[1:]  # the first due-only step looks at every sequence (all prefilled)
    assert looked[0] == n
    # a sequence is looked at once every bs steps (its next block), n // bs of them a step
    assert max(steady) <= n // bs + 1
    assert sum(steady) <= n * (len(steady) // bs + 1)
