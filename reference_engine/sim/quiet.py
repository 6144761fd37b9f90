"""How long a replica's decode window stays quiet: its router-visible state unchanged.

The cluster simulator ends every replica's window at the next arrival anywhere, because the
routing policy reads every replica then. But a policy that reads only `outstanding`
(in the simulator: requests sent there and not yet ended) sees a decoding replica change only
when one of its requests ends. `quiet_until` gives the start of the window's first step that
could change it (a completion, or a block the pool cannot give: the scheduler preempts
there), without taking a step, so the replica may be left behind arrivals routed elsewhere
and its steps taken later (router/cluster_sim.py): up to the arrival routed to it, or up to
that step. The step times are take_steps' (sim/event_skip.py), term for term.
"""

from __future__ import annotations

from cbbench.reference_engine.core.sequence import Sequence
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.sim.event_skip import decode_step_time


def quiet_until(engine: LLMEngine, seqs: list[Sequence]) -> float | None:
    """Engine-clock start of the first step of the window `seqs` (plan_skip's, taken with
    events) that finishes a request or stops for a block; None when the window's steps
    cannot be priced ahead (a fit that prices the KV layout needs the blocks it will get)."""
    ex = engine.executor
    priced = getattr(ex, "decode_time", None)
    if priced is not None:
        ex = ex.inner  # type: ignore[attr-defined]
    cost = ex.cost_model  # type: ignore[attr-defined]
    if cost.uses_layout:
        return None
    bs = engine.block_manager.block_size
    n = len(seqs)
    c0 = [s.num_computed_tokens for s in seqs]
    last = min(s.max_num_tokens - len(s.token_ids) - 1 for s in seqs)  # the first to finish
    assert last >= 0
    # blocks wanted at each step before it, against what the pool holds
    wanted = [0] * (last + 1)
    for r, s in enumerate(seqs):
        assert len(s.block_table) * bs >= c0[r], "a decode's next slot is never behind its table"
        for j in range(len(s.block_table) * bs - c0[r], last + 1, bs):
            wanted[j] += 1
    free = engine.block_manager.num_free_blocks
    sum_end, max_end = sum(c0) + n, max(c0) + 1
    t = ex.clock  # type: ignore[attr-defined]
    hw = cost.hardware
    if hw.linear is None and not hw.steps and priced is None and cost.tp == 1:  # inlined
        peak, bw = hw.peak_flops * hw.flops_efficiency, hw.mem_bw * hw.bw_efficiency
        apf, kvb, swb = cost.attn_flops_per_pair, cost.kv_bytes_per_token, cost.step_weight_bytes
        overhead, host = hw.step_overhead_s, hw.per_seq_overhead_s * n
        c_lin = 2.0 * cost.linear_params * n + cost.head_flops * n
        for j in range(last):
            free -= wanted[j]
            if free < 0:
                return t
            a = apf * sum_end
            kv_bytes = float((sum_end + n) * kvb)
            dense = max((c_lin + a - a) / peak, (swb + kv_bytes - kv_bytes) / bw)
            t += dense + max(a / peak, kv_bytes / bw) + overhead + host
            sum_end += n
        return t
    for j in range(last):
        free -= wanted[j]
        if free < 0:
            return t
        dt, _ = decode_step_time(cost, n, sum_end, max_end)
        if priced is not None:
            dt = priced(dt, max_end)
        t += dt
        sum_end += n
        max_end += 1
    return t
