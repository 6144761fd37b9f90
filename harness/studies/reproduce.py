"""The seed's gains table (static -> continuous, req/s) under stated conditions.

The seed (seeds/002) claims uniform lengths 100 -> 100 req/s (no gain), mixed 10-1000
tokens 40 -> 95 (2.38x), highly mixed 1-4000 tokens 15 -> 85 (5.67x), and device
utilization 80-95 % under continuous batching against 30-50 % under static.

What is measured here is *sustained* throughput: every request arrives at t=0 (a saturated
server), and throughput is counted over the steady window (t_a, t_b] — t_b the moment the
last waiting request is admitted (after it the server only drains, the tail that decided
the old makespan figure), t_a the completion at 10 % of those finished by t_b (start-up).
For static the window is its whole batches but the last (each batch a renewal cycle).
Output tokens/s in that window, with a 95 % interval from the rates of its sub-windows
(static: one per batch; continuous: 5 equal ones); req/s = tok/s / mean output length (completions come in bursts, so counting
them in a window is biased by the bursts at its edges).

The setting a reader would assume (Setting): same device memory for both; static reserves
max_model_len per slot, max_model_len = the workload's longest request, and runs the largest
batch that reservation fits (capped at max_num_seqs); a finished request keeps its row and is
computed as padding until the batch ends (the seed: "its GPU resources, memory and compute
units, are not released until the whole batch completes"; HF generate does this); continuous uses paged KV and vLLM's
defaults, max_num_seqs 256 and a token budget of 8192 per step, chunked prefill.

Utilization, as the seed means it, from the engine's steps in the window:
- busy: fraction of time a step runs (what NVML's "utilization" reports; ~1 for both when
  saturated, which is why the seed's 30-50 % cannot be NVML's figure);
- slot utilization: live sequences computed per step over the batch the policy holds
  (static: its B slots, finished members idling; continuous: its peak concurrency, the most
  the same memory and max_num_seqs let it run), time-weighted: the useful share of the batch.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from cbbench.harness.errors import CbbenchError
from cbbench.reference_engine.config.engine_config import (
    ContinuousConfig,
    EngineConfig,
    StaticConfig,
    kv_blocks_for_memory,
)
from cbbench.reference_engine.core.block_manager import cdiv
from cbbench.reference_engine.sim.simulate import SimResult
from cbbench.workloads.spec import RequestSpec

WORKLOADS = ("uniform", "mixed", "heavy-mixed")
SEED_ROWS = {
    "uniform": {"lengths": "uniform", "static_rps": 100.0, "continuous_rps": 100.0},
    "mixed": {"lengths": "mixed 10-1000 tokens", "static_rps": 40.0, "continuous_rps": 95.0},
    "heavy-mixed": {
        "lengths": "highly mixed 1-4000 tokens",
        "static_rps": 15.0,
        "continuous_rps": 85.0,
    },
}
for _r in SEED_ROWS.values():
    _r["gain"] = _r["continuous_rps"] / _r["static_rps"]
SEED_UTILIZATION = {"static": (0.30, 0.50), "continuous": (0.80, 0.95)}
# two-sided 95 % Student t quantiles, df 1..10
_T95 = (12.71, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


@dataclass(frozen=True)
class Setting:
    model: str = "llama-3-8b"
    hardware: str = "h100"
    executor: str = "sim"  # "real": the model on the CPU, MEASURED
    num_requests: int = 600
    max_num_seqs: int = 256  # continuous; also the cap of static's batch
    max_num_batched_tokens: int = 8192
    static_batch_size: int | None = None  # None: the largest that max_model_len per slot fits
    max_model_len: int | None = None  # None: the workload's longest request
    kv_cache_memory_gb: float | None = None  # GiB; None: what the device leaves after weights
    num_kv_blocks: int | None = None  # overrides kv_cache_memory_gb (the CPU runs set it)
    block_size: int = 16
    length_scale: int = 1  # every prompt and output length divided by this (CPU runs)
    dtype: str = "auto"
    # Static as the seed describes it (HF generate, FasterTransformer): a finished request
    # keeps its row, computed as padding, until the whole batch ends. False: the engine's
    # static, which skips finished rows (the best case for static). Simulator only.
    static_padded: bool = True


class PaddedStatic:
    """Wraps the simulated executor of a static engine: every decode step costs a full
    padded batch, B rows (every slot held, finished or not) at the batch's longest context,
    as when finished requests keep computing padding until the batch ends."""

    def __init__(self, inner, engine) -> None:
        self.inner = inner
        self.engine = engine
        self.cost_model = inner.cost_model

    def now(self) -> float:
        return self.inner.now()

    def advance_to(self, t: float) -> None:
        self.inner.advance_to(t)

    def execute(self, chunks):
        out = self.inner.execute(chunks)
        if chunks and all(c.num_tokens == 1 for c in chunks):
            rows = len(self.engine.scheduler.holders())
            ctx = max(c.end for c in chunks)
            padded = self.cost_model.step_time([(ctx - 1, 1, True)] * rows)
            extra = padded - self.inner.last_step_time
            if extra > 0:
                self.inner.clock += extra
                self.inner.last_step_time = padded
        return out


def scaled(requests: tuple[RequestSpec, ...], scale: int) -> list[RequestSpec]:
    if scale == 1:
        return [replace(r, arrival_s=None) for r in requests]
    return [
        replace(
            r,
            prompt_len=max(1, r.prompt_len // scale),
            output_len=max(1, r.output_len // scale),
            arrival_s=None,
        )
        for r in requests
    ]


def pool_blocks(s: Setting) -> int:
    """KV blocks both policies get: the same device memory."""
    if s.num_kv_blocks:
        return s.num_kv_blocks
    from cbbench.reference_engine.execution.cost_model import CostModel, get_hardware
    from cbbench.reference_engine.model.config import resolve_model_config

    mc = resolve_model_config(s.model)
    dtype = mc.torch_dtype if s.dtype == "auto" else s.dtype
    cost = CostModel(mc, get_hardware(s.hardware), dtype, s.block_size)
    if s.kv_cache_memory_gb:  # GiB, as the engine reads --kv-cache-memory-gb
        return kv_blocks_for_memory(s.kv_cache_memory_gb, cost.kv_bytes_per_token * s.block_size)
    return cost.kv_pool_blocks(s.block_size)


def configs(s: Setting, requests: list[RequestSpec]) -> tuple[EngineConfig, EngineConfig, dict]:
    """(static, continuous) engine configs for these requests, and the conditions used."""
    longest = max(r.prompt_len + r.output_len for r in requests)
    max_len = max(2, s.max_model_len or longest)
    if max_len < longest:
        raise CbbenchError(f"max_model_len {max_len} is below the longest request ({longest})")
    blocks = pool_blocks(s)
    fits = blocks // cdiv(max_len, s.block_size)
    b = min(s.static_batch_size or s.max_num_seqs, fits)
    if b < 1:
        raise CbbenchError(
            f"static batching: one slot of max_model_len {max_len} needs more KV than the pool "
            f"holds ({blocks} blocks of {s.block_size})"
        )
    common = dict(
        model=s.model,
        dtype=s.dtype,
        executor=s.executor,
        hardware=s.hardware,
        num_kv_blocks=blocks,
        block_size=s.block_size,
        max_model_len=max_len,
    )
    static = EngineConfig(
        scheduler="static", static=StaticConfig(batch_size=b, drain_timeout_s=0.0), **common
    )
    cont = EngineConfig(
        scheduler="continuous",
        continuous=ContinuousConfig(
            max_num_seqs=s.max_num_seqs,
            max_num_batched_tokens=max(s.max_num_batched_tokens, s.max_num_seqs),
        ),
        **common,
    )
    cond = {
        "max_model_len": max_len,
        "kv_pool_tokens": blocks * s.block_size,
        "static_batch_size": b,
        "static_batch_limited_by": "memory" if fits < (s.static_batch_size or s.max_num_seqs)
        else "cap",
        "max_num_seqs": s.max_num_seqs,
        "max_num_batched_tokens": cont.continuous.max_num_batched_tokens,
        "static_finished_rows": "padded (computed until the batch ends)" if s.static_padded
        else "skipped",
    }  # fmt: skip
    return static, cont, cond


def _interval(values: list[float]) -> tuple[float, float]:
    """Mean and 95 % half-width of the mean (Student t)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, _T95[min(n - 1, len(_T95)) - 1] * sd / math.sqrt(n)


def sustained(res: SimResult, windows: int = 5) -> dict:
    """Steady-state throughput and utilization of a saturated run (see the module doc).

    Static: the window is its whole batches before the last one (the last is the tail),
    one sub-window per batch (each batch is a renewal cycle). Continuous: from the
    completion at 10 % of those before the last admission to that admission, `windows`
    equal sub-windows."""
    reqs = res.requests
    fin = sorted(r.finished_s for r in reqs if r.finished_s is not None)
    admits = sorted({r.first_scheduled_s for r in reqs if r.first_scheduled_s is not None})
    t_b = admits[-1]
    if res.config.scheduler == "static":
        edges = admits  # batch starts
        steady = len(edges) >= 2
        t_a = edges[0]
    else:
        before = fin[: bisect.bisect_right(fin, t_b)]
        t_a = before[len(before) // 10] if before else t_b
        steady = t_a < t_b
        edges = [t_a + (t_b - t_a) * i / windows for i in range(windows + 1)]
    if not steady:  # one batch: nothing is sustained, fall back to the whole run
        t_a, t_b = 0.0, res.duration_s
        edges = [t_a, t_b]
    span = t_b - t_a
    assert span > 0

    def count_in(times: list[float], lo: float, hi: float) -> int:
        return bisect.bisect_right(times, hi) - bisect.bisect_right(times, lo)

    tokens = sorted(t for r in reqs for t in r.token_times_s)
    tok_rates = [
        count_in(tokens, lo, hi) / (hi - lo) for lo, hi in zip(edges, edges[1:], strict=False)
    ]
    _, tok_hw = _interval(tok_rates)
    tok_rate = count_in(tokens, t_a, t_b) / span
    # In a steady state each completion stands for its output tokens, so req/s = tok/s /
    # the mean output length. Counting completions in the window instead is biased by
    # whichever burst (a static batch, a continuous admission wave) falls at its edges.
    mean_out = sum(len(r.token_times_s) for r in reqs) / len(reqs)
    req_rate = tok_rate / mean_out
    req_hw = tok_hw / mean_out
    busy = live = 0.0
    peak = max((s.num_seqs for s in res.steps), default=0)
    slots = res.config.max_batch_slots if res.config.scheduler == "static" else peak
    for s in res.steps:
        overlap = min(s.end_s, t_b) - max(s.start_s, t_a)
        if overlap > 0:
            busy += overlap
            live += overlap * s.num_seqs / max(1, slots)
    return {
        "steady": steady,
        "sub_windows": len(edges) - 1,
        "window_s": [t_a, t_b],
        "requests_in_window": count_in(fin, t_a, t_b),
        "request_throughput": req_rate,
        "completions_per_s_in_window": count_in(fin, t_a, t_b) / span,
        "request_throughput_ci95": req_hw,
        "output_throughput": tok_rate,
        "output_throughput_ci95": tok_hw,
        "busy_fraction": busy / span,
        "slot_utilization": live / span,
        "batch_slots": slots,
        "makespan_request_throughput": len(fin) / res.duration_s if res.duration_s else None,
        "num_steps": len(res.steps),
        "duration_s": res.duration_s,
    }


def gain_of(st: dict, co: dict, key: str = "request_throughput") -> tuple[float, float]:
    """continuous / static, and its 95 % half-width (relative errors added in quadrature)."""
    g = co[key] / st[key]
    rel = math.hypot((co[f"{key}_ci95"] or 0.0) / co[key], (st[f"{key}_ci95"] or 0.0) / st[key])
    return g, g * rel


def run_pair(
    workload: str,
    s: Setting,
    wrap_executor: Callable | None = None,
    replay_fn: Callable | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Static and continuous on the same requests under setting `s`: one table row.
    `on_progress(done, total)` counts finished requests over both replays."""
    from cbbench.reference_engine.sim.simulate import replay
    from cbbench.workloads import load_workload

    wl = load_workload(workload, num_requests=s.num_requests)
    reqs = scaled(wl.requests, s.length_scale)
    st_cfg, co_cfg, cond = configs(s, reqs)
    run = replay_fn or replay
    kw = {"wrap_executor": wrap_executor} if wrap_executor else {}
    st_kw = dict(kw)
    if s.static_padded:
        if s.executor != "sim":
            raise CbbenchError("a padded static batch is simulated only (static_padded=False)")
        st_kw["wrap_executor"] = PaddedStatic
    if on_progress is not None:
        n = len(reqs)
        st_kw["on_progress"] = lambda done, _: on_progress(done, 2 * n)
        kw["on_progress"] = lambda done, _: on_progress(n + done, 2 * n)
    st_res = run(reqs, st_cfg, **st_kw)
    co_res = run(reqs, co_cfg, **kw)
    st, co = sustained(st_res), sustained(co_res)
    g, g_hw = gain_of(st, co)
    gt, gt_hw = gain_of(st, co, "output_throughput")
    return {
        "workload": workload,
        "setting": asdict(s),
        "conditions": cond,
        "static": st,
        "continuous": co,
        "gain_req_s": g,
        "gain_req_s_ci95": g_hw,
        "gain_tok_s": gt,
        "gain_tok_s_ci95": gt_hw,
        "gain_makespan": co["makespan_request_throughput"] / st["makespan_request_throughput"],
        "results": (st_res, co_res),
    }


def sensitivity_settings(base: Setting) -> list[tuple[str, Setting]]:
    """One factor at a time around `base`: B, max_model_len, KV memory, request count."""
    out = [("base", base)]
    for b in (32, 64):
        out.append((f"B (max_num_seqs, static cap) = {b}", replace(base, max_num_seqs=b)))
    out.append(("max_model_len = 8192 (model maximum)", replace(base, max_model_len=8192)))
    out.append(("static skips finished rows (not padded)", replace(base, static_padded=False)))
    out.append(("KV memory = 16 GiB", replace(base, kv_cache_memory_gb=16.0)))
    out.append(("KV memory = 400 GiB (static B = 256)", replace(base, kv_cache_memory_gb=400.0)))
    for n in (200, 2 * base.num_requests):
        out.append((f"requests = {n}", replace(base, num_requests=n)))
    return out
