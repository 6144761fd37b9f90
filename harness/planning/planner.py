"""`cbbench plan`: the cheapest configuration that meets an SLO, searched in the simulator.

`plan(PlanOptions)` replays the workload (at `rate`, Poisson arrivals; None: the trace's
own arrival times) through N simulated
replicas of each configuration in a declared space (scheduler, max_num_seqs,
max_num_batched_tokens, chunked prefill, KV dtype, router policy), on the event-skipping
path (reference_engine/sim/event_skip.py), and returns every point searched.

Each point's figures carry the simulator's prediction interval (sim/intervals.py, from the
hardware fit's residuals, else the error the hardware was measured with, else "error unknown"
and the band measured elsewhere, intervals.error_of; said on screen),
and each SLO gets a verdict from it: "meets" (the interval's top is within the target),
"misses" (its bottom is above it) or "too close to call". The binding metric is the SLO
whose interval top is nearest its target (the largest top / target).

Search (pruning): replicas are assumed monotone (more replicas never slow a request down),
so for each configuration the fewest replicas that meet are found by bisection on
[min, max]; a configuration is first tried at the cheapest count found so far and dropped
if that misses (it cannot be cheaper; at equal cost the larger margin wins). `jobs` > 1 runs configurations in
waves of that many processes (the bound shared between waves). Ctrl-C keeps what was
searched (`PlanResult.interrupted`). Every figure is SIMULATED.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from cbbench.harness.errors import CbbenchError
from cbbench.harness.planning.extrapolation import outside
from cbbench.harness.planning.space import PlanSpace, Slo, parse_speculative
from cbbench.harness.studies.sim_graphs import fitting
from cbbench.reference_engine.config.options import SIM_DEFAULTS, build_engine_config
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.cost_model import get_hardware
from cbbench.reference_engine.execution.kv_link import get_link
from cbbench.reference_engine.model.config import resolve_model_config
from cbbench.reference_engine.router.cluster_sim import simulate_cluster
from cbbench.reference_engine.router.pd_sim import simulate_pd
from cbbench.reference_engine.router.registry import make_policy
from cbbench.reference_engine.sim import intervals
from cbbench.reference_engine.sim.intervals import error_of, interval_for
from cbbench.reference_engine.sim.pd_link import resolve_link
from cbbench.reference_engine.sim.request_overhead import overhead_of, with_overhead
from cbbench.workloads import Workload, load_workload, with_arrivals

UNMEASURED_BAND = intervals.UNMEASURED_BAND  # a preset nothing measured (intervals.ELSEWHERE)
MEETS, MISSES, CLOSE = "meets", "misses", "too close to call"


@dataclass
class PlanOptions:
    workload: str
    rate: float | None  # requests/s (Poisson); None: the workload's own arrival times
    slos: list[Slo]
    hardware: str
    price_per_replica_hour: float
    model: str | None = None  # default: the fit's model, else llama-3-8b
    space: PlanSpace = field(default_factory=PlanSpace)
    num_requests: int | None = 600
    seed: int = 0
    jobs: int = 1
    goodput_share: float | None = None  # share of requests within every SLO target
    # speculative configurations: each draft token's acceptance (the simulator models it)
    spec_acceptance_rate: float = 0.7
    drop_too_long: bool = False  # skip requests longer than the model's max_model_len


@dataclass
class Point:
    config: dict[str, Any]
    replicas: int
    cost_per_hour: float
    predicted: dict[str, float]  # SLO name -> simulated seconds
    low: dict[str, float]  # the interval's bounds
    high: dict[str, float]
    verdicts: dict[str, str]
    verdict: str
    binding: str  # the SLO whose high / target is largest
    binding_ratio: float  # its high / target
    goodput_share: float
    num_steps: int
    prefill: int = 0  # disaggregated: prefill workers (`replicas` are the decode workers)
    # settings above the steps the fit measured (planning/extrapolation.py): {} inside
    extrapolated: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def workers(self) -> int:
        return self.replicas + self.prefill

    @property
    def mode(self) -> str:
        return self.config.get("mode", "aggregated")


@dataclass
class PlanResult:
    options: PlanOptions
    model: str
    interval_source: str  # where the interval comes from, in words (intervals.error_of)
    points: list[Point]
    chosen: Point | None
    frontier: list[Point]
    searched: int  # configurations searched
    total: int
    interrupted: bool = False
    refused: list[str] = field(default_factory=list)  # configurations the engine refused
    dropped: int = 0  # requests longer than max_model_len skipped (--drop-too-long)

    def to_json(self) -> dict:
        return {
            "simulated": True,
            "options": {**asdict(self.options), "slos": [asdict(s) for s in self.options.slos]},
            "model": self.model,
            "interval_source": self.interval_source,
            "searched": self.searched,
            "total": self.total,
            "interrupted": self.interrupted,
            "refused": self.refused,
            "dropped_too_long": self.dropped,
            "chosen": asdict(self.chosen) if self.chosen else None,
            "frontier": [asdict(p) for p in self.frontier],
            "points": [asdict(p) for p in self.points],
        }


def resolve_model(opts: PlanOptions) -> str:
    """The model to plan for: the fit's own, and a clear error for a fit of another one."""
    try:
        hw = get_hardware(opts.hardware)
    except EngineError as exc:
        raise CbbenchError(f"--hardware: {exc}") from None
    fitted = (hw.fit or {}).get("model")
    if fitted and opts.model and opts.model != fitted:
        raise CbbenchError(
            f"--hardware {opts.hardware} was fitted on model {fitted}, not {opts.model}: "
            f"plan for --model {fitted}, or run `cbbench calibrate --model {opts.model}`"
        )
    return opts.model or fitted or "llama-3-8b"


def _engine_config(c: dict[str, Any], model: str, hardware: str, seed: int,
                   acceptance: float = 0.7):  # fmt: skip
    settings = {"model": model, "hardware": hardware, "batch_size": c["max_num_seqs"],
                "kv_cache_dtype": c["kv_cache_dtype"], "seed": seed,
                "tensor_parallel_size": c.get("tp", 1)}  # fmt: skip
    if c["scheduler"] == "continuous":
        settings.update(max_num_batched_tokens=c["max_num_batched_tokens"],
                        enable_chunked_prefill=c["chunked_prefill"])  # fmt: skip
    spec = parse_speculative(c.get("speculative", "off"))
    if spec is not None:
        method, draft, k = spec
        settings.update(speculative_method=method, num_speculative_tokens=k,
                        speculative_model=draft, spec_acceptance_rate=acceptance)  # fmt: skip
    return build_engine_config(settings, SIM_DEFAULTS, scheduler=c["scheduler"])


def _simulate(opts: PlanOptions, model: str, requests, c: dict[str, Any], replicas: int,
              wl_seed: int, prefix_block_size: int, factor: float = 1.0):  # fmt: skip
    """The SLOs' figures (seconds; inf where none), goodput share and engine steps of one
    configuration simulated with every step `factor` times as long."""
    hw = opts.hardware if factor == 1.0 else f"{opts.hardware}@{factor!r}"
    cfg = _engine_config(c, model, hw, wl_seed, opts.spec_acceptance_rate)
    hw = get_hardware(opts.hardware)
    over = overhead_of(hw)  # a from-run fit's time outside the steps
    if c.get("mode") == "disaggregated":  # P prefill + `replicas` decode workers
        link = resolve_link(c["kv_link"], hw)  # the decode hop's overhead unless measured in it
        res = with_overhead(requests, over, lambda reqs: simulate_pd(
            reqs, cfg, c["prefill"], replicas, get_link(link.spec), seed=wl_seed,
            prefix_block_size=prefix_block_size, decode_overhead=link.decode_overhead(over)),
            replicas)  # fmt: skip
    else:
        res = with_overhead(requests, over, lambda reqs: simulate_cluster(
            reqs, cfg, replicas, make_policy(c["router"]), seed=wl_seed,
            prefix_block_size=prefix_block_size, event_skip=True), replicas)  # fmt: skip
    s = res.summary()
    figs = {}
    for slo in opts.slos:
        key = "ttft" if slo.metric == "ttfo" else slo.metric
        v = (s.get(f"{key}_s") or {}).get(slo.stat)
        figs[slo.name] = float("inf") if v is None else float(v)
    return figs, _goodput(res.requests, opts.slos), sum(t.steps for t in res.replicas)


def evaluate(opts: PlanOptions, model: str, requests, c: dict[str, Any], replicas: int,
             wl_seed: int, prefix_block_size: int) -> Point:  # fmt: skip
    """One configuration at `replicas` replicas: simulated, its interval and verdicts. The
    interval's bounds are simulated too, every step as much slower (faster) as the fit's
    interval allows, so that queueing carries a step-time error into TTFT as it would on a
    real server (more than in proportion near saturation)."""
    hw = get_hardware(opts.hardware)
    c = with_tensor_parallel([c], model, hw)[0]
    args = (opts, model, requests, c, replicas, wl_seed, prefix_block_size)
    pred, good, steps = _simulate(*args)
    iv = interval_for(hw.fit or {}, max(1, steps // replicas)) or error_of(hw)[0]
    high, good_high, _ = _simulate(*args, factor=max(1.0 + iv.high, 1.0))
    low, good_low, _ = _simulate(*args, factor=min(max(1.0 + iv.low, 0.05), 1.0))
    verdicts = {}
    for slo in opts.slos:
        k = slo.name
        low[k], high[k] = min(low[k], pred[k]), max(high[k], pred[k])
        verdicts[k] = MEETS if high[k] <= slo.target_s else (
            MISSES if low[k] > slo.target_s else CLOSE)  # fmt: skip
    if opts.goodput_share is not None:
        share = opts.goodput_share
        verdicts["goodput"] = MEETS if min(good_high, good) >= share else (
            MISSES if max(good_low, good) < share else CLOSE)  # fmt: skip
    vs = set(verdicts.values())
    verdict = MISSES if MISSES in vs else CLOSE if CLOSE in vs else MEETS
    binding = max(opts.slos, key=lambda x: high[x.name] / x.target_s)
    prefill = c.get("prefill", 0) if c.get("mode") == "disaggregated" else 0
    gpus = (replicas + prefill) * c.get("tp", 1)  # --price is per GPU-hour
    return Point(c, replicas, gpus * opts.price_per_replica_hour, pred, low, high,
                 verdicts, verdict, binding.name, high[binding.name] / binding.target_s,
                 good, steps, prefill)  # fmt: skip


def _goodput(reqs, slos: list[Slo]) -> float:
    """Share of requests within every SLO's target (as a per-request bound)."""
    ok = 0
    for r in reqs:
        vals = {"ttft": r.ttft_s, "ttfo": r.ttft_s, "tpot": r.tpot_s, "e2e": r.e2e_s}
        ok += all(vals[s.metric] is None or vals[s.metric] <= s.target_s for s in slos)
    return ok / max(1, len(reqs))


def search_config(opts: PlanOptions, model: str, requests, c: dict[str, Any], bound: int | None,
                  wl_seed: int, prefix_block_size: int) -> list[Point]:  # fmt: skip
    """Bisection on replicas for one configuration: the fewest that meet, at most `bound`
    (the cheapest count found so far) when given. Returns every point evaluated."""
    sp = opts.space
    c = with_tensor_parallel([c], model, get_hardware(opts.hardware))[0]
    lo, hi = sp.min_replicas, sp.max_replicas
    if bound is not None:  # GPUs -> workers of this configuration's size
        bound //= c.get("tp", 1)
    if c.get("mode") == "disaggregated":  # bisection over decode workers, P fixed
        lo, hi = sp.decode_range()
        hi = min(hi, sp.max_replicas - c["prefill"])
        if bound is not None:
            bound -= c["prefill"]  # the bound counts every worker
        if hi < lo:
            return []
    if bound is not None:  # equal cost still competes on the binding SLO's margin
        hi = min(hi, bound)
        if hi < lo:
            return []
    points: list[Point] = []

    def at(r: int) -> Point:
        p = evaluate(opts, model, requests, c, r, wl_seed, prefix_block_size)
        points.append(p)
        return p

    try:
        if at(hi).verdict != MEETS:
            return points  # not even at the most replicas allowed
    except EngineError as exc:  # a combination the engine refuses (say, unchunked < a prompt)
        return [str(exc)]  # type: ignore[list-item]
    while lo < hi:
        mid = (lo + hi) // 2
        if at(mid).verdict == MEETS:
            hi = mid
        else:
            lo = mid + 1
    return points


def _mode(c: dict[str, Any]) -> str:
    return c.get("mode", "aggregated")


def frontier(points: list[Point]) -> list[Point]:
    """Pareto frontier of cost vs the binding ratio (interval top / target): the points no
    other is at most as expensive and at most as close to its limit as (one strictly; a
    costlier point must be at least 1 % further from its limit)."""
    best: list[Point] = []
    for p in sorted(points, key=lambda p: (p.cost_per_hour, p.binding_ratio)):
        if not best or p.binding_ratio < 0.99 * best[-1].binding_ratio:  # 1 %: not noise
            best.append(p)
    return best


def fit_context(wl: Workload, model: str, opts: PlanOptions) -> tuple[Workload, int]:
    """The workload whose requests fit `model`'s max_model_len, and how many went: a request
    longer than it is refused by every configuration, so say so once, up front (or, with
    --drop-too-long, skip those requests as `cbbench sim --drop-too-long` does)."""
    limit = resolve_model_config(model, shape_only=True).max_position_embeddings
    kept, _ = fitting(wl.requests, limit)
    if len(kept) == len(wl.requests):
        return wl, 0
    longest = max(wl.requests, key=lambda r: r.prompt_len + r.output_len)
    if not opts.drop_too_long or not kept:
        raise CbbenchError(
            f"--workload {opts.workload}: {len(wl.requests) - len(kept)} of {len(wl.requests)} "
            f"requests exceed --model {model}'s max_model_len ({limit} tokens), the longest "
            f"request {longest.index} at prompt {longest.prompt_len} + max_tokens "
            f"{longest.output_len} = {longest.prompt_len + longest.output_len}: plan a model "
            f"with a longer context"
            + ("" if not kept else ", or add --drop-too-long to skip those requests")
        )
    return dataclasses.replace(wl, requests=kept), len(wl.requests) - len(kept)


def plan(opts: PlanOptions, on_progress: Callable[[int, int], None] | None = None) -> PlanResult:
    if opts.rate is not None and opts.rate <= 0:
        raise CbbenchError(f"--rate must be > 0 requests/s, got {opts.rate}")
    if opts.price_per_replica_hour <= 0:
        raise CbbenchError(
            f"--price must be > 0 per replica-hour, got {opts.price_per_replica_hour}"
        )
    model = resolve_model(opts)
    wl = load_workload(opts.workload, seed=opts.seed, num_requests=opts.num_requests)
    if not wl.requests:  # else every configuration "misses" with an infinite TTFT
        raise CbbenchError(f"--workload {opts.workload}: no requests")
    wl, dropped = fit_context(wl, model, opts)
    if opts.rate is not None:
        wl = with_arrivals(wl, "poisson", rate=opts.rate, seed=wl.seed)
    elif all(r.arrival_s is None for r in wl.requests):
        raise CbbenchError(f"--workload {opts.workload} has no arrival times: give --rate")
    hw = get_hardware(opts.hardware)
    source = error_of(hw)[2]
    try:  # the space's links as specs: the fit's measured hand-off where it names it
        configs = [{**c, "kv_link": resolve_link(c["kv_link"], hw).spec} if "kv_link" in c else c
                   for c in opts.space.configs()]  # fmt: skip
    except EngineError as exc:
        raise CbbenchError(f"--space kv_link: {exc}") from None
    configs = with_tensor_parallel(configs, model, hw)
    points: list[Point] = []
    bounds: dict[str, int] = {}  # per mode: each mode keeps a frontier of its own
    searched = 0
    refused: list[str] = []  # why the engine refused a configuration, one per refusal
    interrupted = False
    args = (wl.prompt_seed, wl.prefix_block_size)  # the ids bench and sim send
    pool = ProcessPoolExecutor(max_workers=opts.jobs) if opts.jobs > 1 else None
    try:
        for i in range(0, len(configs), max(1, opts.jobs)):
            wave = configs[i : i + max(1, opts.jobs)]
            if pool is None:
                results = [search_config(opts, model, wl.requests, c, bounds.get(_mode(c)), *args)
                           for c in wave]  # fmt: skip
            else:
                futs = [pool.submit(search_config, opts, model, wl.requests, c,
                                    bounds.get(_mode(c)), *args) for c in wave]  # fmt: skip
                results = [f.result() for f in futs]
            for c, pts in zip(wave, results, strict=True):
                if pts and isinstance(pts[0], str):
                    refused.append(pts[0])
                    continue
                points.extend(pts)
                meets = [p.workers * p.config.get("tp", 1) for p in pts if p.verdict == MEETS]
                if meets:
                    bounds[_mode(c)] = min(meets + [bounds.get(_mode(c), 1 << 30)])
            searched += len(wave)
            if on_progress is not None:
                on_progress(searched, len(configs))
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if pool is not None:
            pool.shutdown(wait=not interrupted, cancel_futures=True)
    for p in points:
        p.extrapolated = outside(p.config, hw.fit)
    ok = [p for p in points if p.verdict == MEETS]
    # at one cost, a point the fit measured before one it extrapolates, then the margin
    chosen = min(ok, key=lambda p: (p.cost_per_hour, bool(p.extrapolated), p.binding_ratio),
                 default=None)  # fmt: skip
    return PlanResult(opts, model, source, points, chosen, frontier(points), searched,
                      len(configs), interrupted, refused, dropped)  # fmt: skip


def with_tensor_parallel(configs: list[dict[str, Any]], model: str, hw) -> list[dict[str, Any]]:
    """`tp` "auto" resolved to the fewest GPUs of 1, 2, 4, 8 whose memory holds the model and
    some KV cache (a model that fits one GPU gets 1); duplicates dropped."""
    from cbbench.reference_engine.execution.cost_model import min_tensor_parallel
    from cbbench.reference_engine.model.config import resolve_model_config

    auto = None
    out, seen = [], set()
    for c in configs:
        if c.get("tp") == "auto":
            if auto is None:
                mc = resolve_model_config(model, shape_only=True)
                fitted = (hw.fit or {}).get("tensor_parallel_size")
                auto = fitted or (1 if hw.linear is not None or hw.steps else
                                  min_tensor_parallel(mc, hw, mc.torch_dtype) or 8)  # fmt: skip
            c = {**c, "tp": auto}
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out
