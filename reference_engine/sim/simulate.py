"""Offline replay of a workload through the engine, in-process (no HTTP).

`simulate(requests, config)` replays RequestSpecs (arrival_s None = all at time 0; a session's
later turns follow their replies, sim_arrivals.py) over
SimExecutor's virtual clock and returns per-request timings, the per-step series and, on
request, the slot timeline; every number it produces is SIMULATED (a modelled step time).
`replay(..., config with executor="real")` runs the same loop on the real model runner in
wall-clock time (times measured, relative to the start of the replay).

Over 400 lines because the replay loop, its records and the event-skipping window's
records (`_record_window`, the same fields the loop writes step by step) belong together.
"""

from __future__ import annotations

import contextlib
import heapq
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.core.spec_decode_stats import SpecDecodeStats
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.sim_executor import SimExecutor
from cbbench.reference_engine.sampling_params import SamplingParams
from cbbench.reference_engine.sim.arrivals import Arrivals
from cbbench.reference_engine.sim.event_skip import (
    SkipWindow,
    paused_gc,
    plan_skip,
    skip_blockers,
    take_steps,
)
from cbbench.workloads.spec import RequestSpec
from cbbench.workloads.stats import describe
from cbbench.workloads.tokens import PromptTokenIds, id_pool


@dataclass
class SimRequest:
    request_id: str
    index: int
    prompt_len: int
    output_len: int  # asked (max_tokens)
    priority: int
    arrival_s: float
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    num_cached_tokens: int = 0
    finish_reason: str | None = None
    session_id: str | None = None
    graph: dict | None = None  # an agent-graph call: after, depth, calls, name, wait_s

    @property
    def queue_s(self) -> float | None:
        return None if self.first_scheduled_s is None else self.first_scheduled_s - self.arrival_s

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_s is None else self.finished_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        n = len(self.token_times_s)
        if n < 2 or self.first_token_s is None or self.finished_s is None:
            return None
        return (self.finished_s - self.first_token_s) / (n - 1)


@dataclass
class StepRecord:
    index: int
    start_s: float
    end_s: float
    num_seqs: int
    num_batched_tokens: int
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_reserved_unused_tokens: int
    batch_occupancy: float
    step_gap_s: float | None = None  # executor idle before this step (modelled in the sim)
    scheduler_time_s: float = 0.0  # host wall time to build it (measured, even in the sim)
    slots: list[str | None] | None = None  # request id computed in each slot (timeline only)
    held: list[str | None] | None = None  # request id holding each slot (idle if not computed)
    num_seqs_limit: int = 0  # the running limit admission obeyed (--max-num-seqs auto: moves)


@dataclass
class SimResult:
    config: EngineConfig
    hardware: str  # cost-model hardware (simulated) or the device (measured)
    num_kv_blocks: int
    max_model_len: int
    requests: list[SimRequest]
    steps: list[StepRecord]
    simulated: bool = True
    spec_decode: SpecDecodeStats | None = None  # speculative decoding counters, when on
    skipped_steps: int = 0  # steps taken inside event-skipping windows (event_skip)

    @property
    def duration_s(self) -> float:
        ends = [r.finished_s for r in self.requests if r.finished_s is not None]
        return max(ends) if ends else 0.0

    def summary(self) -> dict:
        """Throughput, latency percentiles, batch occupancy and KV usage (time-weighted over
        steps). All values simulated."""
        dur = self.duration_s
        out_tokens = sum(len(r.token_times_s) for r in self.requests)
        w = np.array([s.end_s - s.start_s for s in self.steps], dtype=np.float64)
        if w.sum() <= 0:
            w = np.ones(len(self.steps))

        def wmean(vals: list[float]) -> float | None:
            return float(np.average(vals, weights=w)) if len(vals) else None

        kv = [s.kv_blocks_used / self.num_kv_blocks for s in self.steps]
        return {
            "simulated": self.simulated,
            "duration_s": dur,
            "num_requests": len(self.requests),
            "num_steps": len(self.steps),
            "request_throughput": len(self.requests) / dur if dur > 0 else None,
            "output_throughput": out_tokens / dur if dur > 0 else None,
            "total_output_tokens": out_tokens,
            "ttft_s": describe([r.ttft_s for r in self.requests]),
            "tpot_s": describe([r.tpot_s for r in self.requests]),
            "e2e_s": describe([r.e2e_s for r in self.requests]),
            "queue_s": describe([r.queue_s for r in self.requests]),
            "batch_occupancy_mean": wmean([s.batch_occupancy for s in self.steps]),
            "kv_usage_mean": wmean(kv),
            "kv_usage_max": max(kv) if kv else None,
            "num_running_mean": wmean([s.num_running for s in self.steps]),
            "num_seqs_limit_mean": wmean([s.num_seqs_limit for s in self.steps]),
            "kv_reserved_unused_tokens_mean": wmean(
                [s.kv_reserved_unused_tokens for s in self.steps]
            ),
            "num_preemptions": sum(r.num_preemptions for r in self.requests),
            "step_gap_s": describe([s.step_gap_s for s in self.steps]),
            "scheduler_time_s": describe([s.scheduler_time_s for s in self.steps]),
            "prefix_cache_hit_rate": (
                sum(r.num_cached_tokens for r in self.requests)
                / max(1, sum(r.prompt_len for r in self.requests))
            ),
            "spec_acceptance_rate": sd.acceptance_rate if (sd := self.spec_decode) else None,
            "spec_mean_accepted_length": sd.mean_accepted_length if sd else None,
        }


def prompt_tokens(
    spec: RequestSpec, vocab_size: int, prefix_block_size: int = 512, seed: int = 0
) -> list[int]:
    """The request's prompt ids: workloads/tokens.py's, the same ids an HTTP run sends."""
    return PromptTokenIds(seed, prefix_block_size, id_pool(vocab_size))(
        spec.index, spec.prompt_len, spec.prefix_ids
    )


def simulate(requests: Sequence[RequestSpec], config: EngineConfig, **kwargs) -> SimResult:
    """Run `requests` through the engine with the simulated executor (virtual clock)."""
    return replay(requests, replace(config, executor="sim"), **kwargs)


class MeasuredClock:
    """Wraps a real executor: the clock advances only by the measured duration of this
    executor's own steps (and idles instantly), so several engines can be stepped in turn
    and each sees the time its steps took, as if it ran alone; load that drifts over time
    then hits every engine alike. Scheduling overhead outside execute() is not counted."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.clock = 0.0

    def now(self) -> float:
        return self.clock

    def advance_to(self, t: float) -> None:
        self.clock = max(self.clock, t)

    def execute(self, chunks):
        t = time.perf_counter()
        out = self.inner.execute(chunks)
        self.clock += time.perf_counter() - t
        return out

    def timed(self, proposer):
        """Wrap a speculative proposer so its draft work counts on this clock too."""
        clock = self

        class Timed:
            def propose(self, chunks):
                t = time.perf_counter()
                proposer.propose(chunks)
                clock.clock += time.perf_counter() - t

        return Timed()


def replay(requests: Sequence[RequestSpec], cfg: EngineConfig, **kwargs) -> SimResult:
    """Run `requests` through an engine built from `cfg` (its executor: "sim" = virtual
    clock, "real" = the model on cfg.device in wall-clock time)."""
    gen = _replay_steps(requests, cfg, **kwargs)
    with paused_gc() if cfg.executor == "sim" else contextlib.nullcontext():
        while True:
            try:
                next(gen)
            except StopIteration as done:
                return done.value


def replay_interleaved(
    requests: Sequence[RequestSpec],
    cfgs: list[EngineConfig],
    on_progress: Callable[[int, int], None] | None = None,
    **kwargs,
) -> list[SimResult]:
    """Replay the same requests on one engine per config, one step of each in turn, every
    real executor on a MeasuredClock: a fair A/B on a machine whose load drifts.
    `on_progress(done, total)` counts finished requests over all engines."""
    finished = [0] * len(cfgs)

    def counter(i: int) -> Callable[[int, int], None] | None:
        if on_progress is None:
            return None

        def update(n: int, total: int) -> None:
            finished[i] = n
            on_progress(sum(finished), total * len(cfgs))

        return update

    gens = [
        _replay_steps(requests, c, measured_clock=True, on_progress=counter(i), **kwargs)
        for i, c in enumerate(cfgs)
    ]
    results: list[SimResult | None] = [None] * len(gens)
    while any(r is None for r in results):
        for i, gen in enumerate(gens):
            if results[i] is None:
                try:
                    next(gen)
                except StopIteration as done:
                    results[i] = done.value
    return [r for r in results if r is not None]


def _replay_steps(
    requests: Sequence[RequestSpec],
    cfg: EngineConfig,
    *,
    prefix_block_size: int = 512,
    seed: int = 0,
    timeline: bool = False,
    max_steps: int = 10_000_000,
    on_progress: Callable[[int, int], None] | None = None,
    measured_clock: bool = False,
    temperature: float = 1.0,
    wrap_executor: Callable | None = None,
    event_skip: bool = False,
) -> Generator[None, None, SimResult]:
    """The replay loop, yielding after every engine step. `seed` (the workload's) and
    `prefix_block_size` give the prompt ids (workloads/tokens.py). `temperature` 0: greedy requests
    (the real model's speculative control accepts every draft only when greedy).
    `wrap_executor(executor, engine)` may replace the executor by a wrapper (now /
    advance_to / execute; a simulated one's wrapper also exposes cost_model), e.g.
    calibration.TracedClock, which gives a real executor its own clock (it times whole
    engine steps, a proposer's work included); idling is then virtual too. `event_skip`:
    decode steps between events are taken k at once (sim/event_skip.py; the same results,
    the stepping path its oracle) where the engine allows it (not with `timeline`)."""
    engine = LLMEngine.from_config(cfg)
    simulated = isinstance(engine.executor, SimExecutor)
    if measured_clock and not simulated:
        engine.executor = MeasuredClock(engine.executor)
        if engine.proposer is not None:
            engine.proposer = engine.executor.timed(engine.proposer)
    elif wrap_executor is not None:
        engine.executor = wrap_executor(engine.executor, engine)
    ex = engine.executor
    virtual = simulated or hasattr(ex, "advance_to")
    prompt_ids = PromptTokenIds(seed, prefix_block_size, id_pool(engine.model_config.vocab_size))
    t0 = engine.now()

    def idle_until(t: float) -> None:  # t relative to t0
        if virtual:
            ex.advance_to(t0 + t)
        else:
            time.sleep(max(0.0, t0 + t - engine.now()))

    arrivals = Arrivals(requests, prompt_ids)  # sessions: later turns follow their replies
    recs: dict[str, SimRequest] = {}
    steps: list[StepRecord] = []
    slot_of: dict[str, int] = {}
    free_slots = list(range(cfg.max_batch_slots))
    num_done = 0
    skipping = event_skip and not timeline and not skip_blockers(engine)
    skipped = 0
    # a reply sends a turn or releases a graph call: skipping windows end at completions
    sessions = any(r.session_id is not None or r.graph is not None for r in requests)
    while arrivals.pending or engine.has_unfinished_requests():
        yield
        now = engine.now() - t0
        for spec, arrival, ids in arrivals.pop_due(now):
            rid = f"req-{spec.index}"
            try:
                engine.add_request(
                    rid,
                    ids,
                    SamplingParams(
                        max_tokens=spec.output_len, ignore_eos=True, temperature=temperature
                    ),
                    priority=spec.priority,
                    arrival_time=t0 + arrival,
                )
            except EngineError as exc:
                raise EngineError(f"workload request {spec.index}: {exc}") from None
            recs[rid] = SimRequest(
                rid, spec.index, len(ids), spec.output_len, spec.priority, arrival,
                session_id=spec.session_id, graph=_graph_fields(spec),
            )  # fmt: skip
            if not arrivals.pending:  # the last arrival: no batch can fill any further
                engine.close_input()
        if not engine.has_unfinished_requests():
            t_next = arrivals.next_time()
            assert t_next is not None, "sessions wait for replies, yet nothing runs"
            idle_until(t_next)
            continue
        if skipping and (plan := plan_skip(engine, max_steps - len(steps), True)) is not None:
            t_next = arrivals.next_time()
            window = take_steps(engine, *plan, None if t_next is None else t0 + t_next,
                                events=True, end_on_finish=sessions)  # fmt: skip
            if window is not None:
                _record_window(engine, window, t0, steps, recs)
                skipped += window.k
                for seq in window.finished:
                    r = recs[seq.request_id]
                    _finished(r, seq.metrics, seq.finish_reason, t0)
                    num_done += 1
                    arrivals.on_finished(seq.request_id, r.finished_s, r.output_token_ids)
                    if on_progress:
                        on_progress(num_done, len(requests))
                continue
        outputs = engine.step()
        # the computed step's own window (with async scheduling the next step already ran)
        start, end = (t - t0 for t in engine.last_step_window)
        if not engine.last_scheduled:  # the policy is waiting: idle to its next event
            wake = [t - t0 for t in (engine.next_wakeup(),) if t is not None and t - t0 > now]
            if arrivals.next_time() is not None:
                wake.append(arrivals.next_time())
            if not wake:
                raise EngineError(
                    f"simulation stalled at t={now:.3f}s with {engine.scheduler.num_waiting} "
                    f"waiting requests and nothing to wake the {engine.scheduler_name} scheduler"
                )
            idle_until(min(wake))
            continue
        if len(steps) >= max_steps:
            raise EngineError(f"simulation exceeded {max_steps} steps")
        stats = engine.get_stats()
        computed = engine.last_scheduled
        rec = StepRecord(
            len(steps), start, end, len(computed), stats.num_batched_tokens, stats.num_running,
            stats.num_waiting, stats.kv_blocks_used, stats.kv_reserved_unused_tokens,
            stats.batch_occupancy, stats.step_gap_s, stats.scheduler_time_s,
        )  # fmt: skip
        rec.num_seqs_limit = stats.num_seqs_limit
        if timeline:
            for rid in computed:
                if rid not in slot_of:
                    slot_of[rid] = heapq.heappop(free_slots)
            rec.slots = [None] * cfg.max_batch_slots
            rec.held = [None] * cfg.max_batch_slots
            for rid, slot in slot_of.items():
                rec.held[slot] = rid
            for rid in computed:
                rec.slots[slot_of[rid]] = rid
            holding = {s.request_id for s in engine.scheduler.holders()}
            for rid in [r for r in slot_of if r not in holding]:
                heapq.heappush(free_slots, slot_of.pop(rid))
        steps.append(rec)
        for o in outputs:
            r = recs[o.request_id]
            r.token_times_s.extend([end] * len(o.new_token_ids))
            r.output_token_ids.extend(o.new_token_ids)
            if o.finished:
                _finished(r, o.metrics, o.finish_reason, t0)
                num_done += 1
                arrivals.on_finished(o.request_id, r.finished_s, r.output_token_ids)
                if on_progress:
                    on_progress(num_done, len(requests))
    return SimResult(
        config=cfg,
        hardware=engine.executor.cost_model.hardware.name  # type: ignore[attr-defined]
        if simulated
        else f"{cfg.device} (measured)",
        num_kv_blocks=engine.block_manager.num_blocks,
        max_model_len=engine.max_model_len,
        requests=[recs[f"req-{s.index}"] for s in requests],
        steps=steps,
        simulated=simulated,
        spec_decode=engine.spec_stats,
        skipped_steps=skipped,
    )


def _graph_fields(spec: RequestSpec) -> dict | None:
    """What the graph session metrics read (harness/results/graph_summary.py)."""
    g = spec.graph
    if g is None:
        return None
    wait = (spec.think_s or 0.0) if g.after else 0.0
    return {"after": list(g.after), "depth": g.depth, "calls": g.calls, "live": len(g.live),
            "name": g.name, "wait_s": wait}  # fmt: skip


def _finished(r: SimRequest, m, reason: str | None, t0: float) -> None:
    assert m.first_scheduled_time is not None and m.first_token_time is not None
    assert m.finished_time is not None
    r.first_scheduled_s = m.first_scheduled_time - t0
    r.first_token_s = m.first_token_time - t0
    r.finished_s = m.finished_time - t0
    r.num_preemptions = m.num_preemptions
    r.num_cached_tokens = m.num_cached_tokens
    r.finish_reason = reason


def _record_window(
    engine: LLMEngine, w: SkipWindow, t0: float, steps: list[StepRecord], recs: dict
) -> None:
    """A skipped window's steps and tokens, as the stepping path records them one by one."""
    es = engine.get_stats()
    slots = engine.config.max_batch_slots
    for j, (n, running, used, reserved, host) in enumerate(w.stats):
        rec = StepRecord(
            len(steps), w.starts[j] - t0, w.ends[j] - t0, n, n, running, es.num_waiting, used,
            reserved, n / slots, w.first_gap_s if j == 0 else host, es.scheduler_time_s,
        )  # fmt: skip
        rec.num_seqs_limit = es.num_seqs_limit
        steps.append(rec)
    ends = [e - t0 for e in w.ends]
    assert w.tokens is not None
    for seq, toks, m in zip(w.seqs, w.tokens, w.taken, strict=True):
        r = recs[seq.request_id]
        r.token_times_s.extend(ends[:m])
        r.output_token_ids.extend(toks)
