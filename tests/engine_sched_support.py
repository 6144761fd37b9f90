"""Test support for the schedulers: simulated engines on tiny pools and a driver loop that
checks the engine's invariants after every step."""

from __future__ import annotations

from dataclasses import dataclass, field

from cbbench.reference_engine.config.engine_config import (
    ContinuousConfig,
    DynamicConfig,
    EngineConfig,
    SpeculativeConfig,
    StaticConfig,
)
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.sampling_params import SamplingParams


def sim_engine(
    scheduler: str = "continuous",
    *,
    num_kv_blocks: int = 256,
    block_size: int = 4,
    max_model_len: int = 128,
    prefix_caching: bool = False,
    static: dict | None = None,
    dynamic: dict | None = None,
    continuous: dict | None = None,
    max_waiting: int | None = None,
    speculative: dict | None = None,
    async_scheduling: bool = False,
) -> LLMEngine:
    """A tiny-model engine with the simulated executor, one virtual time unit per step."""
    cfg = EngineConfig(
        model="tiny",
        executor="sim",
        hardware="steps",
        scheduler=scheduler,
        static=StaticConfig(**(static or {})),
        dynamic=DynamicConfig(**(dynamic or {})),
        continuous=ContinuousConfig(**(continuous or {})),
        block_size=block_size,
        num_kv_blocks=num_kv_blocks,
        max_model_len=max_model_len,
        enable_prefix_caching=prefix_caching,
        max_waiting=max_waiting,
        speculative=SpeculativeConfig(**(speculative or {})),
        async_scheduling=async_scheduling,
    )
    return LLMEngine.from_config(cfg)


@dataclass
class Req:
    rid: str
    prompt: list[int]
    max_tokens: int
    priority: int = 0
    arrival: float = 0.0


@dataclass
class Trace:
    steps: list[list[str]] = field(default_factory=list)  # request ids computed per step
    tokens_per_step: list[int] = field(default_factory=list)
    outputs: dict[str, list[int]] = field(default_factory=dict)
    finish: dict[str, str] = field(default_factory=dict)
    first_scheduled: dict[str, float] = field(default_factory=dict)
    first_token: dict[str, float] = field(default_factory=dict)
    preemptions: dict[str, int] = field(default_factory=dict)
    max_blocks_used: int = 0


def drive(
    engine: LLMEngine,
    reqs: list[Req],
    aborts: dict[int, list[str]] | None = None,
    max_iters: int = 20_000,
) -> Trace:
    """Add requests at their arrival times, step until done (idling the virtual clock when
    the policy waits), abort `aborts[step]` before that step; invariants after each step."""
    pending = sorted(reqs, key=lambda r: r.arrival)
    aborts = aborts or {}
    trace = Trace()
    seqs = {}
    i = 0
    for _ in range(max_iters):
        now = engine.now()
        while i < len(pending) and pending[i].arrival <= now:
            r = pending[i]
            engine.add_request(
                r.rid, r.prompt, SamplingParams(max_tokens=r.max_tokens, ignore_eos=True),
                priority=r.priority, arrival_time=r.arrival,
            )  # fmt: skip
            seqs[r.rid] = engine.seqs[r.rid]
            i += 1
        if i == len(pending) and not engine.has_unfinished_requests():
            break
        for rid in aborts.get(len(trace.steps), []):
            if rid in engine.seqs:
                engine.abort_request(rid)
                trace.finish[rid] = "abort"
            engine.check_invariants()
        outs = engine.step()
        engine.check_invariants()
        if not engine.last_scheduled:  # nothing ran: idle to the next arrival or wakeup
            wake = [t for t in (engine.next_wakeup(),) if t is not None and t > now]
            if i < len(pending):
                wake.append(pending[i].arrival)
            assert wake or not engine.has_unfinished_requests(), "engine stalled"
            if wake:
                engine.executor.advance_to(min(wake))
            continue
        trace.steps.append(list(engine.last_scheduled))
        trace.tokens_per_step.append(engine.get_stats().num_batched_tokens)
        trace.max_blocks_used = max(trace.max_blocks_used, engine.block_manager.num_used_blocks)
        for o in outs:
            trace.outputs.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finished:
                trace.finish[o.request_id] = o.finish_reason
    else:
        raise AssertionError(f"not done after {max_iters} iterations")
    for rid, seq in seqs.items():
        m = seq.metrics
        if m.first_scheduled_time is not None:
            trace.first_scheduled[rid] = m.first_scheduled_time
        if m.first_token_time is not None:
            trace.first_token[rid] = m.first_token_time
        trace.preemptions[rid] = m.num_preemptions
    return trace
