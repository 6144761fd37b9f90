"""The seed's gains table (static -> continuous, req/s) under stated conditions.

Over 400 lines because the setting, its engine configs, the padded static executor (with
its event-skipping price) and the replicate loop are one study read together.

The seed (seeds/002) claims uniform lengths 100 -> 100 req/s (no gain), mixed 10-1000
tokens 40 -> 95 (2.38x), highly mixed 1-4000 tokens 15 -> 85 (5.67x), and device
utilization 80-95 % under continuous batching against 30-50 % under static.

What is measured here is *sustained* throughput: every request arrives at t=0 (a saturated
server), and throughput is counted over the steady window (t_a, t_b] — t_b the moment the
last waiting request is admitted (after it the server only drains, the tail that decided
the old makespan figure), t_a the completion at 10 % of those finished by t_b (start-up).
For static the window is its whole batches but the last (each batch a renewal cycle).
Output tokens/s in that window; req/s = tok/s / mean output length (completions come in
bursts, so counting them in a window is biased by the bursts at its edges).

Intervals come from independent replicates (`run_replicates`): the same setting, one
workload seed each (a fresh request set), static and continuous on the same requests; the
gain's interval is the 95 % Student-t interval of the mean per-replicate gain
(harness/studies/reproduce_stats.py says why, and draws the verdicts from it).

The setting a reader would assume (Setting): same device memory for both; static reserves
max_model_len per slot, max_model_len = the longest request the workload can produce (prompt
cap + output cap: one server for every replicate's request set), and runs the largest
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
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from cbbench.harness.errors import CbbenchError
from cbbench.harness.studies.reproduce_stats import METHOD, t_interval
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


@dataclass(frozen=True)
class Setting:
    model: str = "llama-3-8b"
    hardware: str = "h100"
    executor: str = "sim"  # "real": the model on the CPU, MEASURED
    num_requests: int = 600
    max_num_seqs: int = 256  # continuous; also the cap of static's batch
    max_num_batched_tokens: int = 8192
    static_batch_size: int | None = None  # None: the largest that max_model_len per slot fits
    max_model_len: int | None = None  # None: the longest request the workload can produce
    kv_cache_memory_gb: float | None = None  # GiB; None: what the device leaves after weights
    num_kv_blocks: int | None = None  # overrides kv_cache_memory_gb (the CPU runs set it)
    block_size: int = 16
    length_scale: int = 1  # every prompt and output length divided by this (CPU runs)
    dtype: str = "auto"
    # Static as the seed describes it (HF generate, FasterTransformer): a finished request
    # keeps its row, computed as padding, until the whole batch ends. False: the engine's
    # static, which skips finished rows (the best case for static). Simulator only.
    static_padded: bool = True
    replicates: int = 5  # independent request sets (workload seeds seed, seed + 1, ...)
    seed: int = 0


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

    def decode_time(self, dt: float, max_end: int) -> float:
        """Event skipping (sim/event_skip.py): a decode step of the batch, `dt` unpadded,
        its longest context ending at `max_end`: every held row at that context."""
        from cbbench.reference_engine.sim.event_skip import decode_step_time

        rows = len(self.engine.scheduler.holders())  # step_time of rows x (max_end - 1, 1)
        padded = decode_step_time(self.cost_model, rows, rows * max_end, max_end)[0]
        return padded if padded > dt else dt

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


def longest_possible(workload: str, scale: int = 1) -> int | None:
    """The longest request a preset can produce (prompt cap + output cap, each divided by
    `scale` as `scaled` does): what a static server must reserve per slot for any of its
    request sets. None when the preset's lengths have no cap."""
    from cbbench.workloads.presets import PRESETS

    if workload not in PRESETS:
        return None
    spec = PRESETS[workload].spec

    def top(d: dict) -> int | None:
        if d.get("dist") == "constant":
            return d.get("value")
        if d.get("dist") == "sequence":
            return max(d["values"])
        return d.get("max")

    caps = [top(spec.get(k, {})) for k in ("prompt", "output")]
    if any(c is None for c in caps):
        return None
    return sum(max(1, int(c) // scale) for c in caps)


def configs(
    s: Setting, requests: list[RequestSpec], workload: str | None = None
) -> tuple[EngineConfig, EngineConfig, dict]:
    """(static, continuous) engine configs for these requests, and the conditions used.
    max_model_len: the setting's, else the longest `workload` can produce, else the longest
    of these requests."""
    longest = max(r.prompt_len + r.output_len for r in requests)
    bound = longest_possible(workload, s.length_scale) if workload else None
    max_len = max(2, s.max_model_len or max(bound or 0, longest))
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
        "max_model_len_from": "setting" if s.max_model_len else
        "the workload's longest possible request" if bound and bound >= longest
        else "the longest request",
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


def sustained(res: SimResult) -> dict:
    """Steady-state throughput and utilization of a saturated run (see the module doc).

    Static: the window is its whole batches before the last one (the last is the tail;
    each batch is a renewal cycle). Continuous: from the completion at 10 % of those before
    the last admission to that admission."""
    reqs = res.requests
    fin = sorted(r.finished_s for r in reqs if r.finished_s is not None)
    admits = sorted({r.first_scheduled_s for r in reqs if r.first_scheduled_s is not None})
    t_b = admits[-1]
    if res.config.scheduler == "static":
        steady = len(admits) >= 2  # batch starts
        t_a = admits[0]
    else:
        before = fin[: bisect.bisect_right(fin, t_b)]
        t_a = before[len(before) // 10] if before else t_b
        steady = t_a < t_b
    if not steady:  # one batch: nothing is sustained, fall back to the whole run
        t_a, t_b = 0.0, res.duration_s
    span = t_b - t_a
    assert span > 0

    def count_in(times: list[float], lo: float, hi: float) -> int:
        return bisect.bisect_right(times, hi) - bisect.bisect_right(times, lo)

    tokens = sorted(t for r in reqs for t in r.token_times_s)
    tok_rate = count_in(tokens, t_a, t_b) / span
    # In a steady state each completion stands for its output tokens, so req/s = tok/s /
    # the mean output length. Counting completions in the window instead is biased by
    # whichever burst (a static batch, a continuous admission wave) falls at its edges.
    mean_out = sum(len(r.token_times_s) for r in reqs) / len(reqs)
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
        "window_s": [t_a, t_b],
        "requests_in_window": count_in(fin, t_a, t_b),
        "request_throughput": tok_rate / mean_out,
        "completions_per_s_in_window": count_in(fin, t_a, t_b) / span,
        "output_throughput": tok_rate,
        "busy_fraction": busy / span,
        "slot_utilization": live / span,
        "batch_slots": slots,
        "makespan_request_throughput": len(fin) / res.duration_s if res.duration_s else None,
        "num_steps": len(res.steps),
        "duration_s": res.duration_s,
    }


def run_pair(
    workload: str,
    s: Setting,
    seed: int | None = None,
    wrap_executor: Callable | None = None,
    replay_fn: Callable | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Static and continuous on the same requests (workload seed `seed`, default s.seed)
    under setting `s`: one replicate. `on_progress(done, total)` counts finished requests
    over both replays."""
    from cbbench.reference_engine.sim.simulate import replay
    from cbbench.workloads import load_workload

    seed = s.seed if seed is None else seed
    wl = load_workload(workload, seed=seed, num_requests=s.num_requests)
    reqs = scaled(wl.requests, s.length_scale)
    st_cfg, co_cfg, cond = configs(s, reqs, workload)
    run = replay_fn or replay
    kw: dict = {"seed": wl.seed}
    if s.executor == "sim" and replay_fn is None:  # the same results, far fewer steps
        kw["event_skip"] = True
    if wrap_executor:
        kw["wrap_executor"] = wrap_executor
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
    return {
        "workload": workload,
        "seed": seed,
        "setting": asdict(s),
        "conditions": cond,
        "static": st,
        "continuous": co,
        "gain_req_s": co["request_throughput"] / st["request_throughput"],
        "gain_tok_s": co["output_throughput"] / st["output_throughput"],
        "gain_makespan": co["makespan_request_throughput"] / st["makespan_request_throughput"],
        "results": (st_res, co_res),
    }


def run_replicates(
    workload: str,
    s: Setting,
    wrap_executor: Callable | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    on_result: Callable[[dict, tuple], None] | None = None,
) -> dict:
    """`s.replicates` independent replicates (workload seeds s.seed, s.seed + 1, ...) of
    `run_pair`, and the 95 % t-intervals across them. A simulated replicate whose request
    set equals an earlier one's (constant lengths) is that replicate again (the simulator
    is deterministic) and is not rerun. `on_result(row, (static, continuous))` gets each
    replicate's results as it ends (they are not kept: a long run's token times are large);
    `on_progress(done, total)` counts finished requests over all replicates
    (reproduce_jobs.run_replicates: the same over several processes)."""
    assert s.replicates >= 1
    total = 2 * s.num_requests * s.replicates
    reps: list[dict] = []
    seen: dict[tuple, dict] = {}
    for i in range(s.replicates):
        seed = s.seed + i
        prog = None if on_progress is None else (
            lambda done, _n, _b=2 * s.num_requests * i: on_progress(_b + done, total)
        )  # fmt: skip
        key = None
        if s.executor == "sim":
            wl_reqs = scaled(_requests(workload, seed, s.num_requests), s.length_scale)
            key = tuple((r.prompt_len, r.output_len) for r in wl_reqs)
            if key in seen:
                reps.append({**seen[key], "seed": seed, "same_requests_as_seed": seen[key]["seed"]})
                if prog:
                    prog(2 * s.num_requests, total)
                continue
        row = run_pair(workload, s, seed, wrap_executor=wrap_executor, on_progress=prog)
        results = row.pop("results")
        if on_result is not None:
            on_result(row, results)
        del results
        if key is not None:
            seen[key] = row
        reps.append(row)
    return replicates_summary(workload, s, reps)


def replicates_summary(workload: str, s: Setting, reps: list[dict]) -> dict:
    """The replicates' rows and the 95 % t-intervals across them."""
    conds = [r["conditions"] for r in reps]
    assert all(c == conds[0] for c in conds), "replicates must run under the same conditions"

    def across(f: Callable[[dict], float]) -> dict:
        return t_interval([f(r) for r in reps]).to_json()

    return {
        "workload": workload,
        "setting": asdict(s),
        "conditions": conds[0],
        "replicates": reps,
        "seeds": [r["seed"] for r in reps],
        "method": METHOD,
        "static_req_s": across(lambda r: r["static"]["request_throughput"]),
        "continuous_req_s": across(lambda r: r["continuous"]["request_throughput"]),
        "gain_req_s": across(lambda r: r["gain_req_s"]),
        "gain_tok_s": across(lambda r: r["gain_tok_s"]),
        "gain_makespan": across(lambda r: r["gain_makespan"]),
        "utilization": {
            k: {u: across(lambda r, k=k, u=u: r[k][u])["mean"]
                for u in ("busy_fraction", "slot_utilization")}
            for k in ("static", "continuous")
        },  # fmt: skip
    }


def _requests(workload: str, seed: int, n: int) -> tuple[RequestSpec, ...]:
    from cbbench.workloads import load_workload

    return load_workload(workload, seed=seed, num_requests=n).requests
