"""Property tests (hypothesis): random request streams, tiny block pools, every scheduler.

Checked after every step by `engine.check_invariants()` (no block owned twice, ref counts
match owners, free list exact, slots within the policy's limit); at the end: every request
finished or was aborted, the pool is whole again, the token budget and max_num_seqs held,
and every finished request got exactly the tokens it gets alone on a roomy engine
(the simulator's tokens depend on (request, position) only, so any preemption or batching
difference would show).
"""

from __future__ import annotations

from engine_sched_support import Req, drive, sim_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

BLOCK = 4
MAX_LEN = 64
PREFIXES = [[], list(range(100, 108)), list(range(200, 216))]

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def streams(draw, max_requests: int = 10) -> list[Req]:
    n = draw(st.integers(1, max_requests))
    reqs = []
    for i in range(n):
        prefix = PREFIXES[draw(st.integers(0, len(PREFIXES) - 1))]
        tail = draw(st.integers(1, 20))
        prompt = prefix + [(i * 7 + j) % 500 for j in range(tail)]
        max_tokens = draw(st.integers(1, MAX_LEN - len(prompt)))
        reqs.append(
            Req(
                f"r{i}",
                prompt,
                max_tokens,
                priority=draw(st.integers(0, 3)),
                arrival=float(draw(st.integers(0, 15))),
            )
        )
    return reqs


@st.composite
def abort_plans(draw, reqs: list[Req]) -> dict[int, list[str]]:
    plan: dict[int, list[str]] = {}
    for r in reqs:
        if draw(st.booleans()) and draw(st.booleans()):
            plan.setdefault(draw(st.integers(0, 40)), []).append(r.rid)
    return plan


def reference_outputs(reqs: list[Req]) -> dict[str, list[int]]:
    """Each request alone-ish on a roomy engine: no preemption possible."""
    return drive(sim_engine(num_kv_blocks=1024, max_model_len=MAX_LEN), reqs).outputs


def check_common(engine, trace, reqs, aborts):
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    aborted = {rid for rids in aborts.values() for rid in rids}
    for r in reqs:
        assert trace.finish.get(r.rid) in ("length", "abort"), r.rid
        if trace.finish[r.rid] == "length":
            assert len(trace.outputs[r.rid]) == r.max_tokens
        else:
            assert r.rid in aborted
    ref = reference_outputs(reqs)
    for rid, reason in trace.finish.items():
        if reason == "length":
            assert trace.outputs[rid] == ref[rid], rid
        elif rid in trace.outputs:  # aborted mid-way: a prefix of the full stream
            assert ref[rid][: len(trace.outputs[rid])] == trace.outputs[rid]


@st.composite
def continuous_cases(draw):
    reqs = draw(streams())
    max_num_seqs = draw(st.integers(1, 6))
    chunked = draw(st.booleans())
    budget = draw(st.integers(max_num_seqs, 48)) if chunked else draw(st.integers(MAX_LEN, 96))
    cfg = {
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": budget,
        "enable_chunked_prefill": chunked,
        "policy": draw(st.sampled_from(["fcfs", "priority"])),
        "aging_rate": draw(st.sampled_from([0.0, 0.5, 2.0])),
        "max_queue_wait_s": draw(st.sampled_from([None, None, 4.0])),
        "max_prefills_per_step": draw(st.sampled_from([None, 1, 2])),
        "watermark": draw(st.sampled_from([0.0, 0.1])),
    }
    num_blocks = draw(st.integers(MAX_LEN // BLOCK, 40))
    prefix = draw(st.booleans())
    aborts = draw(abort_plans(reqs))
    return reqs, cfg, num_blocks, prefix, aborts


@SETTINGS
@given(continuous_cases())
def test_continuous_properties(case):
    reqs, cfg, num_blocks, prefix, aborts = case
    e = sim_engine(
        continuous=cfg, num_kv_blocks=num_blocks, max_model_len=MAX_LEN, prefix_caching=prefix
    )
    trace = drive(e, reqs, aborts)
    check_common(e, trace, reqs, aborts)
    assert all(len(s) <= cfg["max_num_seqs"] for s in trace.steps)
    assert all(n <= cfg["max_num_batched_tokens"] for n in trace.tokens_per_step)
    assert trace.max_blocks_used <= num_blocks
    if cfg["max_queue_wait_s"] is not None:
        return
    # queue order: a request admitted strictly earlier than one that was already waiting
    # must not have a worse queue key (FCFS: arrival; priority: priority + aging * arrival)
    by_id = {r.rid: r for r in reqs}
    rate = cfg["aging_rate"]

    def key(r: Req) -> tuple:
        idx = int(r.rid[1:])
        if cfg["policy"] == "fcfs":
            return (r.arrival, idx)
        return (r.priority + rate * r.arrival, r.arrival, idx)

    fs = trace.first_scheduled
    for x, tx in fs.items():
        for y, ty in fs.items():
            if ty < tx and by_id[x].arrival <= ty:  # x was waiting when y got in
                assert key(by_id[y]) < key(by_id[x]), (y, x)


@st.composite
def batch_cases(draw, scheduler: str):
    reqs = draw(streams(max_requests=8))
    b = draw(st.integers(1, 4))
    if scheduler == "static":
        sub = {"batch_size": b, "drain_timeout_s": float(draw(st.integers(0, 6)))}
        min_blocks = b * (MAX_LEN // BLOCK)
    else:
        sub = {
            "max_batch_size": b,
            "preferred_batch_sizes": tuple(
                draw(st.lists(st.integers(1, b), max_size=2, unique=True))
            ),
            "max_queue_delay_s": float(draw(st.integers(0, 6))),
        }
        min_blocks = MAX_LEN // BLOCK
    num_blocks = draw(st.integers(min_blocks, min_blocks + 20))
    return reqs, sub, num_blocks, draw(abort_plans(reqs))


def check_batches(trace, limit: int):
    """Run to completion: a batch's members are computed in consecutive steps and no new
    member joins until all of its members are done."""
    assert all(len(s) <= limit for s in trace.steps)
    batch: set[str] = set()
    for s in trace.steps:
        ids = set(s)
        if ids - batch:  # a new batch starts: nobody from the old one is still computing
            assert not (ids & batch), "a batch admitted new members before it ended"
            batch = ids
        else:
            assert ids <= batch


@SETTINGS
@given(batch_cases("static"))
def test_static_properties(case):
    reqs, sub, num_blocks, aborts = case
    e = sim_engine("static", static=sub, num_kv_blocks=num_blocks, max_model_len=MAX_LEN)
    trace = drive(e, reqs, aborts)
    check_common(e, trace, reqs, aborts)
    check_batches(trace, sub["batch_size"])


@SETTINGS
@given(batch_cases("dynamic"))
def test_dynamic_properties(case):
    reqs, sub, num_blocks, aborts = case
    e = sim_engine("dynamic", dynamic=sub, num_kv_blocks=num_blocks, max_model_len=MAX_LEN)
    trace = drive(e, reqs, aborts)
    check_common(e, trace, reqs, aborts)
    check_batches(trace, sub["max_batch_size"])
