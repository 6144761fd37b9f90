"""Event-skipping simulation: k decode steps taken at once, between events.

Between events (an arrival, a completion, a KV block boundary that allocates, a preemption,
a chunk boundary, an admission) a running batch's composition does not change: every member
decodes one token a step and its context grows by one. The scheduler would return the same
sequences every step, so `plan_skip` says whether the next steps can be skipped and
`take_steps` takes them in one go: each step's time from the cost model in closed form
(`decode_step_time`: the same arithmetic as `CostModel.work` + `time_of`, term for term),
the virtual clock advanced step by step, tokens appended once per window. With `events`
the window also runs through block boundaries (blocks allocated in the scheduler's rank
order, stopping where the pool runs dry: the scheduler preempts there) and completions
(finished as the stepping path finishes them; the window ends there if a request waits to
be admitted). The step after a window is a real `engine.step()`: the scheduler decides at
every admission, preemption and prefill.

The step-by-step path stays the oracle (tests/test_event_skip.py compares them on seeded
workloads). Where a feature cannot skip, the engine steps (`skip_blockers` says why):
- speculative decoding (drafts are proposed and accepted per step), async scheduling (the
  pipeline keeps a step in flight), MoE models (per-step routing draws), an executor
  wrapper (a calibration trace, the real model) and EOS draws (a stop token): never
  skipped. A wrapper that prices a decode step its own way says so with `inner` (the
  simulated executor) and `decode_time(dt, longest context) -> seconds` (reproduce's
  padded static batch);
- continuous batching skips only while no request can be admitted (the queue is empty, or
  the running set is at its limit and no `max_queue_wait_s` can force one in), with no
  adaptive limit, no expert balance, and a token budget that holds every decode;
- a prefill or a prefill chunk is never skipped (a window holds decodes only).
A calibrated CPU fit that prices the KV layout (`uses_layout`) is evaluated per step with
`CostModel.work` over the window's block tables (no scheduler: still cheaper).
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from cbbench.reference_engine.core.executor import ScheduledChunk
from cbbench.reference_engine.core.sequence import Sequence, SequenceStatus
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.execution.cost_model import CostModel, gather_calls
from cbbench.reference_engine.execution.sim_executor import SimExecutor

MIN_SKIP = 2  # a window shorter than this is stepped (the bookkeeping costs a step)


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector off while a simulation runs (a decorator or a `with`).
    The engine's objects form no cycles worth collecting mid-run, and each full collection
    scans every live token list and KV block: at 64 replicas x 6,400 requests that was 40 %
    of the skipping path's time and 14 % of the stepping path's. Reference counting still
    frees everything as usual; collection resumes after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclass
class SkipWindow:
    """k decode steps taken at once: every member of `seqs` got one token per step."""

    seqs: list[Sequence]  # the batch at the first step (rank order)
    starts: list[float]  # engine clock, per step
    ends: list[float]
    tokens: list[list[int]] | None  # per seq, its new tokens (None: not generated)
    step_gap_s: float | None  # the modelled gap before every step but the first
    first_gap_s: float | None  # before the first one (None after idling)
    k: int  # steps taken
    # integrals over the window of (running + waiting) and of KV blocks used (after each
    # step, times its length); the sequences that finished in it (their metrics say when)
    load_area: float = 0.0
    kv_area: float = 0.0
    finished: list[Sequence] = field(default_factory=list)
    taken: list[int] = field(default_factory=list)  # per seq, steps it took (finished ones)
    stats: list[tuple[int, int, int, int, float]] = field(default_factory=list)  # per_step


def skip_blockers(engine: LLMEngine) -> list[str]:
    """Why this engine cannot skip at all (empty: it can, between events)."""
    ex, cfg = engine.executor, engine.config
    why = []
    if hasattr(ex, "decode_time"):  # a wrapper that prices decode steps its own way
        ex = getattr(ex, "inner", None)
    if type(ex) is not SimExecutor:
        why.append("not the plain simulated executor (a wrapper or the real model)")
    elif ex.routing is not None:
        why.append("a mixture-of-experts model (routing drawn per step)")
    elif ex.eos_probability:
        why.append("EOS draws")
    elif ex.jitter is not None:
        why.append("a from-run fit's step jitter (a draw per step)")
    if engine.proposer is not None or cfg.speculative.enabled:
        why.append("speculative decoding")
    if cfg.async_scheduling:
        why.append("async scheduling")
    if cfg.scheduler == "continuous":
        if cfg.continuous.adaptive_num_seqs:
            why.append("--max-num-seqs auto (the limit moves every step)")
        if cfg.continuous.expert_balance:
            why.append("expert balance")
    return why


def plan_skip(
    engine: LLMEngine, max_steps: int, events: bool = False
) -> tuple[list[Sequence], int] | None:
    """(the batch a window would decode, in rank order; how many steps it may take, <=
    max_steps) if the scheduler's state lets the next steps be skipped; None when the next
    step must be the scheduler's. Without `events` the window ends before the first block
    boundary and the first completion (nothing changes but tokens and the clock); with
    them it runs through both (take_steps allocates and finishes as the stepping path
    would), so it is bounded by max_steps only. Time (arrivals, wake-ups) is the caller's
    horizon (take_steps)."""
    sched = engine.scheduler
    name = sched.name
    if name == "continuous":
        running = list(sched._running.order)  # type: ignore[attr-defined]
        cfg = engine.config.continuous
        if len(running) > cfg.max_num_batched_tokens:
            return None  # the budget cuts the batch: who runs changes step to step
        if sched.waiting and (
            len(running) < sched.num_seqs_limit or cfg.max_queue_wait_s is not None  # type: ignore[attr-defined]
        ):
            return None  # an admission may happen at any step
    elif name in ("static", "dynamic"):
        running = [s for s in sched.batch if s.status is not SequenceStatus.FINISHED]  # type: ignore[attr-defined]
    else:
        return None
    if not running:
        return None
    bs = engine.block_manager.block_size
    k = max_steps
    for s in running:
        if s.status is not SequenceStatus.RUNNING or s.stop_token_ids:
            return None
        ntok = len(s.token_ids)
        if ntok - s.num_computed_tokens != 1 or s.metrics.first_token_time is None:
            return None  # a prefill (or a chunk of one: its last token may be a chunk too)
        if not events:  # steps before it needs a new block / before the step finishing it
            k = min(k, len(s.block_table) * bs - s.num_computed_tokens, s.max_num_tokens - ntok - 1)
            if k < MIN_SKIP:
                return None
    return running, k


def decode_step_time(cost: CostModel, n: int, sum_end: int, max_end: int) -> tuple[float, float]:
    """(step time, host seconds) of a decode step of n sequences whose contexts end at
    positions summing to `sum_end` (the longest `max_end`): CostModel.work + time_of's
    arithmetic, in the same order, for a dense model without async overlap or drafts."""
    hw = cost.hardware
    if hw.steps:
        return 1.0, 0.0
    attn_flops = cost.attn_flops_per_pair * sum_end
    flops = 2.0 * cost.linear_params * n + cost.head_flops * n + attn_flops
    kv_bytes = float((sum_end + n) * cost.kv_bytes_per_token)
    nbytes = cost.step_weight_bytes + kv_bytes
    lin = hw.linear
    if lin is not None:
        bs = cost.block_size
        padded = n * (-(-max_end // bs) * bs)
        calls = gather_calls(n, padded // n, cost.k_token_bytes)
        feats = {
            "c0": 1.0, "c_host": 1.0, "c_flops": flops, "c_bytes": nbytes, "c_tok": n,
            "c_sample": n, "c_seq": n, "c_prefill": 0, "c_dec_ctx": padded,
            "c_dec_in_place": 0, "c_dec_gathered": padded, "c_dec_calls": calls,
            "c_pre_ctx": 0, "c_mixed": 0.0, "c_dec_kv": sum_end,
        }  # fmt: skip
        total = max(0.0, sum(c * float(feats[t]) for t, c in lin.items()))
        return total, min(total, lin.get("c_host", 0.0) + lin.get("c_seq", 0.0) * n)
    peak, bw = hw.peak_flops * hw.flops_efficiency, hw.mem_bw * hw.bw_efficiency
    dense = max((flops - attn_flops - 0.0) / 1 / peak, (nbytes - kv_bytes - 0.0) / bw)
    attention = max(attn_flops / 1 / peak, kv_bytes / 1 / bw)
    host = hw.per_seq_overhead_s * n
    if cost.tp > 1:  # CostModel._total_and_host's tensor-parallel arithmetic
        return (dense / cost.tp + attention / cost.tp + cost.allreduce_s(n)
                + hw.step_overhead_s + host), host  # fmt: skip
    return dense + attention + hw.step_overhead_s + host, host


def _filler(s: Sequence, vocab: int) -> int:
    """A skipped token's stand-in id: one per request of the engine (its arrival index)."""
    return s.seq_index * 2654435761 % vocab


def take_steps(
    engine: LLMEngine,
    seqs: list[Sequence],
    max_steps: int,
    horizon: float | None,
    want_tokens: bool = True,
    events: bool = False,
    end_on_finish: bool = False,
    per_step: bool = True,
) -> SkipWindow | None:
    """Take up to `max_steps` decode steps of `seqs` (plan_skip's) at once, each starting
    before `horizon` (engine clock; the first starts now). With `events` (plan_skip's) the
    window allocates each block at its boundary, in rank order as the scheduler does
    (stopping before a step whose block the pool cannot give: the scheduler preempts
    there), and finishes sequences as the stepping path does; it ends after a step that
    finished one while requests wait (a slot opened) or when `end_on_finish` (sessions).
    Without `events`, None (nothing taken) when fewer than MIN_SKIP steps fit.
    `want_tokens` False: decoded tokens get a per-request filler id (the caller keeps
    counts only; a request's blocks still hash apart from every other request's, so prefix
    hits are the same).
    `per_step` False: starts/ends hold the window's first start and last end only (the
    areas under running + waiting and KV blocks used carry the rest)."""
    wall = time.perf_counter()
    ex = engine.executor
    priced = getattr(ex, "decode_time", None)  # a wrapper's price of a decode step
    if priced is not None:
        ex = ex.inner  # type: ignore[attr-defined]
    assert isinstance(ex, SimExecutor)
    cost = ex.cost_model
    hw = cost.hardware
    sched = engine.scheduler
    bm = engine.block_manager
    bs = bm.block_size
    layout = cost.uses_layout
    roofline = hw.linear is None and not hw.steps and not layout and cost.tp == 1
    peak, bw = hw.peak_flops * hw.flops_efficiency, hw.mem_bw * hw.bw_efficiency
    apf, kvb, swb = cost.attn_flops_per_pair, cost.kv_bytes_per_token, cost.step_weight_bytes
    overhead, per_seq_s = hw.step_overhead_s, hw.per_seq_overhead_s
    c0 = [s.num_computed_tokens for s in seqs]
    n = len(seqs)
    sum_end = sum(c0) + n
    need_max = hw.linear is not None or priced is not None
    max_end = max(c0) + 1 if need_max else 0
    allocs: dict[int, list[int]] = {}  # step -> ranks that need a block at it
    fins: dict[int, list[int]] = {}  # step -> ranks that finish at it
    for r, s in enumerate(seqs):
        allocs.setdefault(len(s.block_table) * bs - c0[r], []).append(r)
        fins.setdefault(s.max_num_tokens - len(s.token_ids) - 1, []).append(r)
    if not events:
        max_steps = min(max_steps, min(allocs), min(fins))
    active = [True] * n
    taken = [0] * n  # steps each sequence took in the window
    free_left = bm.num_free_blocks
    used = bm.num_used_blocks
    peak_used = bm.peak_used
    load_now = sched.num_running + sched.num_waiting
    t = ex.clock
    host_first = 0.0
    # the gap before a step: the simulator's modelled host time, or (a wrapper without
    # one) the clock's own: none inside a window, and before it what the engine measures
    modeled = hasattr(engine.executor, "modeled_gap_s")
    gap0 = None if modeled else engine._gap(t)
    starts: list[float] = []
    ends: list[float] = []
    load_area = kv_area = 0.0
    finished: list[Sequence] = []
    host = per_seq_s * n
    c_lin = 2.0 * cost.linear_params * n + cost.head_flops * n
    # per_step: (seqs computed, running after, KV blocks used after, reserved-unused KV
    # token slots after, host seconds) of each step, as EngineStats reads them
    stats: list[tuple[int, int, int, int, float]] = []
    reserved = sched.reserved_unused_tokens() if per_step else 0
    j = 0
    while j < max_steps and n:
        if j and horizon is not None and t >= horizon:
            break
        due = allocs.pop(j, None)
        used_before = used
        if due is not None:
            due.sort()
            stop = False
            for i, r in enumerate(due):
                if not active[r]:
                    continue
                # allocate_slots(seq, computed + 1) for its one new block, inlined (hot)
                if free_left < 1:
                    allocs[j] = due[i:]  # the scheduler preempts here: its step
                    stop = True
                    break
                seqs[r].block_table.append(bm._pop_free())
                free_left -= 1
                used += 1
                allocs.setdefault(j + bs, []).append(r)
            if used > peak_used:
                peak_used = used
            if stop:
                break
        if roofline:  # decode_step_time's arithmetic, inlined (hot); x - 0.0, x / 1 dropped
            a = apf * sum_end
            kv_bytes = float((sum_end + n) * kvb)
            dense = max((c_lin + a - a) / peak, (swb + kv_bytes - kv_bytes) / bw)
            dt = dense + max(a / peak, kv_bytes / bw) + overhead + host
        elif layout:  # the fit prices the block tables' layout: the step's own work
            w = cost.work(
                (c0[r] + j, 1, True, seqs[r].block_table) for r in range(len(seqs)) if active[r]
            )
            dt, host = cost.time_of(w), cost.split_time(w)[1]
        else:
            dt, host = decode_step_time(cost, n, sum_end, max_end)
        if priced is not None:
            dt = priced(dt, max_end)
        if per_step or not starts:
            starts.append(t)
        t_start = t
        t += dt
        if per_step:
            ends.append(t)
            reserved += (used - used_before) * bs - n
        n_step, host_step = n, host
        if j == 0:
            host_first = host
        j += 1
        done = fins.pop(j - 1, None)
        if done is not None:
            ex.clock = t
            for r in sorted(done):
                if not active[r]:
                    continue
                s = seqs[r]
                _advance(ex, s, j, want_tokens, bm)
                taken[r] = j
                active[r] = False
                n -= 1
                sum_end -= c0[r] + j
                engine._finish(s, "length", t)
                finished.append(s)
            used = bm.num_used_blocks
            free_left = bm.num_free_blocks
            load_now = sched.num_running + sched.num_waiting
            host = per_seq_s * n
            c_lin = 2.0 * cost.linear_params * n + cost.head_flops * n
            if need_max and n:  # the longest context at the next step, less the +1 below
                max_end = max(c0[r] + j for r in range(len(seqs)) if active[r])
            if per_step:  # the others' computed counts lag by j until the window ends
                reserved = sched.reserved_unused_tokens() - j * n
        if per_step:
            stats.append((n_step, sched.num_running, used, reserved, host_step if modeled else 0.0))
        load_area += load_now * (t - t_start)
        kv_area += used * (t - t_start)
        sum_end += n
        max_end += 1
        if done is not None and (end_on_finish or sched.waiting):
            break
    if not per_step and starts:
        ends.append(t)
    k = j
    if k == 0 or (not events and k < MIN_SKIP):
        assert not finished
        return None
    bm.peak_used = max(bm.peak_used, peak_used)
    tokens: list[list[int]] | None = [] if want_tokens else None
    for r, s in enumerate(seqs):
        if active[r]:
            taken[r] = k
            new = _advance(ex, s, k, want_tokens, bm)
        else:
            new = s.token_ids[len(s.token_ids) - taken[r] :]
        if tokens is not None:
            tokens.append(new)
    ex.clock = t
    last_dt = t - t_start
    ex.last_step_time = last_dt
    first_gap = None if engine._last_compute_end is None else host_first  # _gap's
    if not modeled:
        first_gap = gap0
    ex.modeled_gap_s = host_step
    engine.num_steps += k
    sched.resync()  # sequences advanced without schedule()
    last = seqs if not finished else [s for r, s in enumerate(seqs) if taken[r] == k]
    engine._last_chunks = [ScheduledChunk(s, 1) for s in last]
    engine.last_step_window = (t_start, t)
    sched_s = (time.perf_counter() - wall) / k
    engine._update_stats(len(last), len(last), last_dt, sched_s, host_step)
    engine._last_compute_end = t if engine.seqs else None
    return SkipWindow(seqs, starts, ends, tokens, host_step, first_gap, k, load_area, kv_area,
                      finished, taken, stats)  # fmt: skip


def _advance(ex: SimExecutor, s: Sequence, m: int, real: bool, bm) -> list[int]:
    """m decode steps of s: m tokens appended (the executor's own, or fillers), m more
    computed, newly full blocks registered in the prefix cache."""
    pos = len(s.token_ids)
    if real:
        new = [ex.token_for(s.request_id, pos + i) for i in range(m)]
    else:
        new = [_filler(s, ex.model_config.vocab_size)] * m
    s.token_ids.extend(new)
    c = s.num_computed_tokens
    s.num_computed_tokens = c + m
    assert s.metrics.first_token_time is not None and len(s.token_ids) <= s.max_num_tokens
    bs = bm.block_size
    if (c + m) // bs > c // bs:  # a block filled up (the last step registered the rest)
        bm.cache_blocks(s)
    return new
