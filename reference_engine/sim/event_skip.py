"""Event-skipping simulation: k decode steps taken at once, between events.

Between events (an arrival, a completion, a KV block boundary that allocates, a preemption,
a chunk boundary, an admission) a running batch's composition does not change: every member
decodes one token a step and its context grows by one. The scheduler would return the same
sequences every step, so `plan_skip` finds how many steps k can pass before the next event
and `take_steps` applies them in one go: step times from the cost model evaluated over the
k steps at once (`decode_step_times`, the same arithmetic as `CostModel.work` + `time_of`,
vectorised), tokens appended, the virtual clock advanced step by step. The step after the
window (the event) is a real `engine.step()`: the scheduler decides at every event.

The step-by-step path stays the oracle (tests/test_event_skip.py compares them on seeded
workloads). Where a feature cannot skip, the engine steps (`skip_blockers` says why):
- speculative decoding (drafts are proposed and accepted per step), async scheduling (the
  pipeline keeps a step in flight), MoE models (per-step routing draws), an executor
  wrapper (reproduce's padded static batch, a calibration trace) and EOS draws (a stop
  token): never skipped;
- continuous batching skips only while no request can be admitted (the queue is empty, or
  the running set is at its limit and no `max_queue_wait_s` can force one in), with no
  adaptive limit, no expert balance, and a token budget that holds every decode;
- a prefill or a prefill chunk is never skipped (a window holds decodes only).
A calibrated CPU fit that prices the KV layout (`uses_layout`) is evaluated per step over
the window's fixed block tables (no scheduler, no allocation: still far cheaper).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from cbbench.kernels.kv_layout import GATHER_BYTES
from cbbench.reference_engine.core.executor import ScheduledChunk
from cbbench.reference_engine.core.sequence import Sequence, SequenceStatus
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.execution.cost_model import CostModel
from cbbench.reference_engine.execution.sim_executor import SimExecutor

MIN_SKIP = 2  # a window shorter than this is stepped (the bookkeeping costs a step)
FILLER = 0  # a skipped token's id where nobody reads it (see take_steps)


@dataclass
class SkipWindow:
    """k decode steps taken at once: every member of `seqs` got one token per step."""

    seqs: list[Sequence]
    starts: list[float]  # engine clock, per step
    ends: list[float]
    tokens: list[list[int]] | None  # per seq, its k new tokens (None: not generated)
    step_gap_s: float | None  # the modelled gap before every step but the first
    first_gap_s: float | None  # before the first one (None after idling)

    @property
    def k(self) -> int:
        return len(self.ends)


def skip_blockers(engine: LLMEngine) -> list[str]:
    """Why this engine cannot skip at all (empty: it can, between events)."""
    ex, cfg = engine.executor, engine.config
    why = []
    if type(ex) is not SimExecutor:
        why.append("not the plain simulated executor (a wrapper or the real model)")
    elif ex.routing is not None:
        why.append("a mixture-of-experts model (routing drawn per step)")
    elif ex.eos_probability:
        why.append("EOS draws")
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


def plan_skip(engine: LLMEngine, max_steps: int) -> tuple[list[Sequence], int] | None:
    """(the sequences a window would decode, how many steps it may take: <= max_steps) if
    at least MIN_SKIP steps can be skipped as far as the scheduler's state goes; None when
    the next step must be taken by the scheduler. Time (arrivals, wake-ups) is the caller's
    horizon (take_steps)."""
    sched = engine.scheduler
    name = sched.name
    if name == "continuous":
        running = list(sched._order or sched._running)  # type: ignore[attr-defined]
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
        if ntok - s.num_computed_tokens != 1:
            return None  # a prefill (or a chunk of one)
        # steps before it needs a new block / before the step that finishes it
        k = min(k, len(s.block_table) * bs - s.num_computed_tokens, s.max_num_tokens - ntok - 1)
        if k < MIN_SKIP:
            return None
    return running, k


def decode_step_times(
    cost: CostModel, ends: list[int], k: int, tables: list[list[int]] | None = None
) -> tuple[np.ndarray, float]:
    """(step times, host seconds) of k decode steps of the same sequences, whose contexts
    end at `ends` on the first step (computed tokens + 1) and grow by one a step: what
    CostModel.work + time_of give step by step (no async overlap, no drafts, dense model).
    `tables`: the block tables (fixed over the window), when the fit prices the layout."""
    n = len(ends)
    hw = cost.hardware
    if hw.steps:
        return np.ones(k), 0.0
    if cost.uses_layout:  # the layout changes with the lengths: price each step
        assert tables is not None
        times = np.empty(k)
        for j in range(k):
            w = cost.work((e - 1 + j, 1, True, t) for e, t in zip(ends, tables, strict=True))
            times[j] = cost.time_of(w)
        return times, _host(cost, n)
    j = np.arange(k, dtype=np.int64)
    total_end = int(sum(ends))
    pairs = total_end + n * j
    kv_tokens = total_end + n + n * j
    bs = cost.block_size
    padded = n * (-(-(max(ends) + j) // bs) * bs)
    attn_flops = cost.attn_flops_per_pair * pairs
    flops = 2.0 * cost.linear_params * n + cost.head_flops * n + attn_flops
    kv_bytes = (kv_tokens * cost.kv_bytes_per_token).astype(np.float64)
    nbytes = cost.step_weight_bytes + kv_bytes
    if hw.linear is not None:
        per_seq = 2 * (padded // n) * cost.k_token_bytes
        calls = -(-n // np.maximum(1, GATHER_BYTES // np.maximum(1, per_seq)))
        feats = {
            "c0": 1.0, "c_host": 1.0, "c_flops": flops, "c_bytes": nbytes, "c_tok": float(n),
            "c_sample": float(n), "c_seq": float(n), "c_prefill": 0.0,
            "c_dec_ctx": padded.astype(np.float64), "c_dec_in_place": 0.0,
            "c_dec_gathered": padded.astype(np.float64), "c_dec_calls": calls.astype(np.float64),
            "c_pre_ctx": 0.0, "c_mixed": 0.0,
        }  # fmt: skip
        total = np.zeros(k)
        acc = 0  # the same order of additions as CostModel._total_and_host's sum()
        for t, c in hw.linear.items():
            acc = acc + c * feats[t]
        total = np.maximum(0.0, total + acc)
        host = np.minimum(total, hw.linear.get("c_host", 0.0) + hw.linear.get("c_seq", 0.0) * n)
        return total, float(host.max()) if n else 0.0
    peak, bw = hw.peak_flops * hw.flops_efficiency, hw.mem_bw * hw.bw_efficiency
    dense = max((flops[0] - attn_flops[0]) / peak, (nbytes[0] - kv_bytes[0]) / bw)
    attention = np.maximum(attn_flops / peak, kv_bytes / bw)
    host = hw.per_seq_overhead_s * n
    return dense + attention + hw.step_overhead_s + host, host


def _host(cost: CostModel, n: int) -> float:
    hw = cost.hardware
    if hw.linear is not None:
        return hw.linear.get("c_host", 0.0) + hw.linear.get("c_seq", 0.0) * n
    return hw.per_seq_overhead_s * n


def take_steps(
    engine: LLMEngine,
    seqs: list[Sequence],
    max_steps: int,
    horizon: float | None,
    want_tokens: bool = True,
) -> SkipWindow | None:
    """Take up to `max_steps` decode steps of `seqs` (from plan_skip) at once, each one
    starting before `horizon` (engine clock; the first starts now). Returns None (nothing
    taken) when fewer than MIN_SKIP steps fit. `want_tokens` False: the skipped tokens are
    stored as FILLER ids (the caller keeps counts only, and without prefix caching nothing
    reads a decoded token's id)."""
    wall = time.perf_counter()
    ex = engine.executor
    assert isinstance(ex, SimExecutor)
    cost = ex.cost_model
    ends0 = [s.num_computed_tokens + 1 for s in seqs]
    tables = [s.block_table for s in seqs] if cost.uses_layout else None
    dts, host = decode_step_times(cost, ends0, max_steps, tables)
    now = ex.clock
    starts: list[float] = []
    ends: list[float] = []
    t = now
    for dt in dts.tolist():  # one add a step, as the executor's clock does
        if starts and horizon is not None and t >= horizon:
            break
        starts.append(t)
        t += dt
        ends.append(t)
    k = len(ends)
    if k < MIN_SKIP:
        return None
    bm = engine.block_manager
    caching = bm.enable_prefix_caching
    real = want_tokens or caching
    tokens: list[list[int]] | None = [] if real else None
    for s in seqs:
        pos = len(s.token_ids)
        if real:
            new = [ex.token_for(s.request_id, pos + j) for j in range(k)]
            tokens.append(new)  # type: ignore[union-attr]
            s.token_ids.extend(new)
        else:
            s.token_ids.extend([FILLER] * k)
        s.num_computed_tokens += k
        assert s.metrics.first_token_time is not None and len(s.token_ids) < s.max_num_tokens
        if caching:
            bm.cache_blocks(s)
    ex.clock = t
    ex.last_step_time = float(dts[k - 1])
    ex.modeled_gap_s = host
    first_gap = engine._gap(now)
    engine.num_steps += k
    engine._last_chunks = [ScheduledChunk(s, 1) for s in seqs]
    engine.last_step_window = (starts[-1], ends[-1])
    sched_s = (time.perf_counter() - wall) / k
    engine._update_stats(len(seqs), len(seqs), ends[-1] - starts[-1], sched_s, host)
    engine._last_compute_end = ends[-1]
    return SkipWindow(seqs, starts, ends, tokens, host, first_gap)
