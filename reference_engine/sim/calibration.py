"""Calibrating the simulator's step-time model against the real engine, and checking it.

`calibrate()` runs the real engine (ModelRunner, whole engine loop: scheduler, batch
preparation, sampling, bookkeeping) over a few *fit* workloads, static and continuous,
records every step's work (cost_model.StepWork) and its duration — the time from the end of
the previous step to the end of this one, so everything the engine spends per step is in it
and the durations sum to the run's time — and fits cost_model.STEP_TERMS by non-negative
least squares on absolute seconds (what a run's total time, hence throughput, sums).

validation.Validation then replays a *held-out* workload (not used for fitting: the
`chat` preset by default), static and continuous, simulated with the fitted hardware and
real, and compares throughput and p99 E2E.

Clocks: "wall" (perf_counter; the honest one on a quiet machine) or "cpu" (this thread's CPU
time, with one torch thread all the model's work runs on it): on a machine shared with other
jobs the wall clock counts time the process waited for a core, the CPU clock does not, so
"cpu" is the one to use under load (it still feels cache and memory-bandwidth contention).

Over 400 lines because the fit, its drift correction and the interleaved real runs share the
traced clock; the grid fit and the held-out check are apart (calibration_grid, validation).
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
from cbbench.reference_engine.config.engine_config import (
    ContinuousConfig,
    EngineConfig,
    StaticConfig,
)
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.cost_model import (
    STEP_TERMS,
    CostModel,
    HardwareSpec,
    StepWork,
    fit_linear,
)
from cbbench.reference_engine.sim.step_range import step_range
from cbbench.workloads.spec import RequestSpec


class HeldOutCheck(Protocol):
    """What calibrate() needs of a held-out check (validation.Validation): its real
    runs, stepped in turn with the fit runs, and where their results go."""

    workload: str
    real: dict

    def real_jobs(self) -> list[tuple[str, tuple[list[RequestSpec], EngineConfig]]]: ...


CLOCKS = ("wall", "cpu")
# Held-out workload of the validation (the setting): never used for fitting.
VALIDATION = {"workload": "chat", "num_requests": 24, "batch_size": 8, "max_model_len": 2048}
# Held-out presets `--validate-workloads` knows: (requests, B) sized to a few minutes on CPU.
HELD_OUT = {"chat": (24, 8), "uniform": (8, 4)}
TARGETS = {"throughput": 0.05, "e2e_p99": 0.10}
DRIFT_WINDOW = 25  # rounds of run_interleaved sharing one machine-speed factor in the fit


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the real engines built inside with `n` torch threads (None: leave the default)."""
    from cbbench.reference_engine.execution.model_runner import THREADS_ENV

    old = os.environ.get(THREADS_ENV)
    if n is not None:
        if n < 1:
            raise EngineError(f"threads must be >= 1, got {n}")
        os.environ[THREADS_ENV] = str(n)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(THREADS_ENV, None)
        else:
            os.environ[THREADS_ENV] = old


class TracedClock:
    """Wraps a real executor: its clock is wall or thread-CPU time (idle advances it
    virtually), and it records (work, duration) for every step it executes."""

    def __init__(self, inner, cost: CostModel, clock: str = "wall") -> None:
        if clock not in CLOCKS:
            raise EngineError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
        self.inner = inner
        self.cost = cost
        self._read = time.perf_counter if clock == "wall" else time.thread_time
        self._offset = 0.0
        self._mark: float | None = None
        self._paused_at = 0.0
        self.steps: list[tuple[StepWork, float]] = []
        self.host_s: list[float] = []  # per step: the part outside execute() (scheduler, update)
        # per step: (start, num_tokens, samples, block table) per chunk, for refits offline
        self.shapes: list[list[tuple]] = []

    def now(self) -> float:
        return self._read() + self._offset

    def pause(self) -> None:
        """Stop this clock while other engines run (run_interleaved)."""
        self._paused_at = self._read()

    def resume(self) -> None:
        self._offset -= self._read() - self._paused_at

    def advance_to(self, t: float) -> None:
        n = self.now()
        if t > n:
            self._offset += t - n
        self._mark = self.now()

    def execute(self, chunks):
        if self._mark is None:
            self._mark = self.now()
        start = self.now()
        out = self.inner.execute(chunks)
        end = self.now()
        # the step's work, block tables included; its counting stops the clock
        shape = [(c.start, c.num_tokens, bool(c.samples), tuple(c.seq.block_table))
                 for c in chunks]  # fmt: skip
        work = self.cost.work(shape)
        self.shapes.append(shape)
        self._offset -= self.now() - end
        self.steps.append((work, end - self._mark))
        self.host_s.append(start - self._mark)
        self._mark = end
        return out


@dataclass(frozen=True)
class FitRun:
    """One fit run: its scheduler, requests and B; continuous runs may have a step token
    budget below their prompts (chunked prefill) and a shared system prompt (prefix caching
    on, `prefix_tokens` in ids of PREFIX_BLOCK tokens)."""

    scheduler: str
    requests: list[RequestSpec]
    b: int
    token_budget: int = 8192
    prefix_tokens: int = 0

    def label(self) -> str:
        extra = f" chunk {self.token_budget}" if self.token_budget < 8192 else ""
        extra += f" prefix {self.prefix_tokens}" if self.prefix_tokens else ""
        return f"fit {self.scheduler} B={self.b}{extra}"


PREFIX_BLOCK = 64  # tokens per shared-prefix id, as random_draws' system prompts


def fit_workloads(scale: float = 1.0, seed: int = 1) -> list[FitRun]:
    """Runs whose steps span the shapes a serving run meets: 1..12 sequences, contexts up to
    ~1.4k tokens, whole-prompt prefills alone and mixed with decodes, short prompts in wide
    batches with many small admissions, and (the last two) prompts chunked at admission under
    a 128 / 256-token step budget beside decodes, one of them after a cached system prompt:
    without these the fit sees only whole prompts, and prices a chunk by what a whole
    prompt's attention call costs. Uniform random lengths (not the validation's lognormal
    chat mix)."""
    rng = random.Random(seed)

    def reqs(n: int, prompt: tuple[int, int], output: tuple[int, int], prefix: int = 0):
        pre = tuple(range(prefix // PREFIX_BLOCK))
        return [
            RequestSpec(i, max(prefix + 4, rng.randint(*prompt)),
                        max(2, int(rng.randint(*output) * scale)), prefix_ids=pre)
            for i in range(n)
        ]  # fmt: skip

    def n(k: int) -> int:
        return max(4, int(k * scale))

    return [
        FitRun("continuous", reqs(n(20), (8, 768), (8, 640)), 12),
        FitRun("static", reqs(n(16), (8, 768), (8, 512)), 6),
        FitRun("continuous", reqs(n(10), (8, 256), (8, 320)), 3),
        FitRun("static", reqs(n(8), (8, 384), (4, 256)), 2),
        FitRun("continuous", reqs(n(24), (8, 160), (16, 400)), 8),
        FitRun("static", reqs(n(16), (8, 160), (16, 320)), 8),
        FitRun("continuous", reqs(n(16), (64, 1024), (4, 96), prefix=192), 6, 128, 192),
        FitRun("continuous", reqs(n(16), (32, 640), (8, 160)), 8, 256),
    ]


def engine_config(
    model: str,
    scheduler: str,
    b: int,
    max_model_len: int,
    executor: str,
    hardware: str,
    dtype: str,
    num_kv_blocks: int | None = None,
) -> EngineConfig:
    return EngineConfig(
        model=model,
        dtype=dtype,
        scheduler=scheduler,
        executor=executor,
        hardware=hardware,
        static=StaticConfig(batch_size=b, drain_timeout_s=0.0),
        continuous=ContinuousConfig(max_num_seqs=b, max_num_batched_tokens=max(8192, b)),
        max_model_len=max_model_len,
        num_kv_blocks=num_kv_blocks,
    )


def _traced(cost_of: Callable[[object], CostModel], clock: str, traces: list):
    def wrap(executor, engine):
        t = TracedClock(executor, cost_of(engine), clock)
        traces.append(t)
        return t

    return wrap


def run_interleaved(
    jobs: list[tuple[list[RequestSpec], EngineConfig] | tuple[list[RequestSpec], EngineConfig, dict]],
    clock: str,
    on_progress: Callable[[int, int], None] | None = None,
    clocks: list | None = None,
) -> list[tuple[object, list[tuple[StepWork, float]]]]:
    """Replay every job on its own real engine, one engine step of each in turn, each on a
    TracedClock that runs only while its engine does: load that drifts over time on a
    shared machine then hits every job alike. Returns (SimResult, traced steps, host seconds
    per step) per job (`clocks`, when given, receives each job's TracedClock, raw step
    shapes included); a job's optional third item: keyword arguments of its replay
    (prefix_block_size). `on_progress(done, total)` counts finished requests over all jobs."""
    from cbbench.reference_engine.sim.simulate import _replay_steps

    traces: list[list[TracedClock]] = [[] for _ in jobs]
    finished = [0] * len(jobs)
    total = sum(len(job[0]) for job in jobs)

    def counter(i: int) -> Callable[[int, int], None] | None:
        if on_progress is None:
            return None

        def update(n: int, _: int) -> None:
            finished[i] = n
            on_progress(sum(finished), total)

        return update

    gens = [
        _replay_steps(
            job[0], job[1], wrap_executor=_traced(_cost_for, clock, traces[i]),
            on_progress=counter(i), **(job[2] if len(job) > 2 else {}),
        )  # fmt: skip
        for i, job in enumerate(jobs)
    ]
    results: list[object] = [None] * len(jobs)
    while any(r is None for r in results):
        for i, gen in enumerate(gens):
            if results[i] is not None:
                continue
            if traces[i]:
                traces[i][0].resume()
            try:
                next(gen)
            except StopIteration as done:
                results[i] = done.value
            if traces[i] and results[i] is None:
                traces[i][0].pause()
    if clocks is not None:
        clocks.extend(t[0] for t in traces)
    return [(results[i], traces[i][0].steps, traces[i][0].host_s) for i in range(len(jobs))]


def fit_step_terms(
    works: list[StepWork],
    times: list[float],
    host: list[float],
    rounds: list[int] | None = None,
    window: int = DRIFT_WINDOW,
) -> tuple[dict[str, float], dict[str, float]]:
    """Two stages. The host terms are what the engine spends outside the model per step
    (c_host) and per sequence (c_seq): scheduling, output processing, the work async
    scheduling hides; they are fitted on the measured host part of each step; in decode steps
    tokens, samples and sequences are equal, so the whole duration alone could not tell them
    apart. The other terms are then fitted to the whole duration less that, so the fit's
    summed time stays the measured one.

    `rounds` (per step: its round in run_interleaved, where every run steps once per round)
    lets the second stage see the machine's speed drift: the runs stepping together in a
    window of `window` rounds share one speed factor, fitted jointly with the terms
    (alternating), so that a slow minute of the machine is not read as the cost of the shapes
    that happened to run in it. The factors average 1 over the fit's time."""
    host_coef, _ = fit_linear(works, [max(h, 1e-9) for h in host], ("c0", "c_seq"),
                              relative=False)  # fmt: skip
    c_host, c_seq = host_coef["c0"], host_coef["c_seq"]
    rest = tuple(t for t in STEP_TERMS if t not in ("c_seq", "c_host"))
    left = [max(t - c_host - c_seq * w.num_seqs, 1e-9) for w, t in zip(works, times, strict=True)]
    coef, _ = fit_linear(works, left, rest, relative=False)
    speed: list[float] = []
    if rounds is not None:
        coef, speed = _fit_with_drift(works, left, rest, rounds, window)
    # least squares keeps the summed time only while the intercept is free; NNLS may hold
    # c0 at 0 (the data wanting a negative one), so scale the terms back to the sum
    fitted = sum(sum(c * w.feature(t) for t, c in coef.items()) for w in works)
    if fitted > 0:
        coef = {t: c * sum(left) / fitted for t, c in coef.items()}
    coef = {t: {"c_seq": c_seq, "c_host": c_host}.get(t, coef.get(t, 0.0)) for t in STEP_TERMS}
    pred = [sum(c * w.feature(t) for t, c in coef.items()) for w in works]
    y = sum(times) / len(times)
    rel = [abs(p - t) / t for p, t in zip(pred, times, strict=True)]
    ss_res = sum((p - t) ** 2 for p, t in zip(pred, times, strict=True))
    ss_tot = sum((t - y) ** 2 for t in times) or 1e-30
    err = {
        "mean_rel_error": sum(rel) / len(rel),
        "max_rel_error": max(rel),
        "r2": 1.0 - ss_res / ss_tot,
        "total_time_error": sum(pred) / sum(times) - 1.0,
        "host_share": sum(c_host + c_seq * w.num_seqs for w in works) / sum(times),
    }
    if speed:
        err["speed_drift"] = [min(speed), max(speed)]
        err["speed_factors"] = [round(f, 4) for f in speed]  # per window of `window` rounds
    return coef, err


def _fit_with_drift(
    works: list[StepWork],
    times: list[float],
    terms: tuple[str, ...],
    rounds: list[int],
    window: int,
    max_iter: int = 200,
) -> tuple[dict[str, float], list[float]]:
    """NNLS of `terms` with a speed factor per window of rounds: time = factor x model,
    alternating between the two until the factors settle. Factors average 1 (weighted by
    the modelled time)."""
    assert len(rounds) == len(works) == len(times) and window >= 1
    win = np.array(rounds) // window
    y = np.array(times)
    X = np.array([w.features(terms) for w in works])
    speed = np.ones(int(win.max()) + 1)
    coef, _ = fit_linear(works, times, terms, relative=False)
    for _ in range(max_iter):
        pred = X @ np.array([coef[t] for t in terms])
        den = np.bincount(win, pred, len(speed))
        new = np.where(den > 0, np.bincount(win, y, len(speed)) / np.maximum(den, 1e-300), 1.0)
        new /= float((new[win] * pred).sum() / pred.sum())
        coef, _ = fit_linear(works, list(y / new[win]), terms, relative=False)
        done = float(np.abs(new - speed).max()) < 1e-7
        speed = new
        if done:
            break
    return coef, [float(f) for f in speed]


def _cost_for(engine) -> CostModel:
    base = HardwareSpec("trace", 1.0, 1.0, 1.0)
    dtype = str(engine.executor.dtype).removeprefix("torch.")
    return CostModel(engine.model_config, base, dtype, engine.config.block_size)


@dataclass
class Calibration:
    spec: HardwareSpec
    works: list[StepWork] = field(default_factory=list)
    measured_s: list[float] = field(default_factory=list)
    predicted_s: list[float] = field(default_factory=list)
    no_drift: HardwareSpec | None = None  # the same steps fitted without drift factors
    # per run (fit runs, then held-out): label, raw step shapes, durations, host seconds
    trace: list[dict] = field(default_factory=list)


def calibrate(
    model: str = "small",
    dtype: str = "float32",
    clock: str = "wall",
    scale: float = 1.0,
    name: str | None = None,
    log: Callable[[str], None] = print,
    validation: HeldOutCheck | list[HeldOutCheck] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> Calibration:
    """Run the fit workloads on the real engine (CPU, the caller sets torch's threads) and fit
    the step-time model to every step's measured duration. With `validation` (one or
    several), the held-out real runs step in turn with the fit runs (run_interleaved), so
    load that drifts on a shared machine hits the fit and the held-out runs alike.
    `on_progress(done, total)` counts finished requests over all those runs."""
    from cbbench.reference_engine.sim.simulate import replay

    warm = [RequestSpec(0, 16, 4), RequestSpec(1, 32, 4)]
    replay(warm, engine_config(model, "continuous", 2, 64, "real", "h100", dtype))
    fits = fit_workloads(scale)
    jobs = []
    for f in fits:
        max_len = max(r.prompt_len + r.output_len for r in f.requests)
        cfg = engine_config(model, f.scheduler, f.b, max_len, "real", "h100", dtype)
        cont = replace(cfg.continuous, max_num_batched_tokens=max(f.token_budget, f.b))
        cfg = replace(cfg, continuous=cont, enable_prefix_caching=f.prefix_tokens > 0)
        jobs.append((f.requests, cfg, {"prefix_block_size": PREFIX_BLOCK}))
    checks = validation if isinstance(validation, list) else [validation] if validation else []
    held = [(v, s, job) for v in checks for s, job in v.real_jobs()]
    t0 = time.perf_counter()
    clocks: list[TracedClock] = []
    out = run_interleaved(jobs + [job for _, _, job in held], clock, on_progress, clocks)
    works: list[StepWork] = []
    times: list[float] = []
    host: list[float] = []
    rounds: list[int] = []
    run_of: list[int] = []
    for k, (f, (_, steps, host_s)) in enumerate(zip(fits, out, strict=False)):
        run_of += [k] * len(steps)
        works += [w for w, _ in steps]
        times += [d for _, d in steps]
        host += host_s
        rounds += range(len(steps))  # run_interleaved: step i of every run is in round i
        log(
            f"  fit run: {f.scheduler:<10} B={f.b:<3} {len(f.requests):>3} requests "
            f"{len(steps):>5} steps  {sum(d for _, d in steps):7.2f} s ({clock} clock)"
        )
    for (check, scheduler, _), (res, steps, _h) in zip(held, out[len(jobs) :], strict=True):
        check.real[scheduler] = (res.summary(), steps)
        log(f"  held-out run: {check.workload:<8} {scheduler:<10} "
            f"{sum(d for _, d in steps):7.2f} s ({clock} clock)")  # fmt: skip
    log(f"  (all runs stepped in turn: {time.perf_counter() - t0:.0f} s wall)")
    if len(works) < len(STEP_TERMS):
        raise EngineError(f"calibration: only {len(works)} steps measured")
    from cbbench.reference_engine.sim.intervals import run_errors

    coef, err = fit_step_terms(works, times, host, rounds)
    coef_nd, err_nd = fit_step_terms(works, times, host)  # drift robustness: without factors
    err["interval"] = {
        "run_errors": [round(e, 5) for e in run_errors(works, times, host, rounds, run_of,
                                                        DRIFT_WINDOW, fit_step_terms)],  # fmt: skip
        "speed_factors": err.pop("speed_factors"),
        "window": DRIFT_WINDOW,
        "method": "leave-one-fit-run-out step-model errors (drift divided out) and the "
        "spread of the drift factors over the run's windows (reference_engine/sim/intervals.py)",
    }
    name = name or f"measured-{model.rstrip('/').rsplit('/', 1)[-1]}-cpu"
    spec = measured_spec(
        name,
        coef,
        {"model": model, "device": "cpu", "dtype": dtype, "clock": clock,
         "method": "engine step trace, NNLS on seconds, speed drift per window of "
         f"{DRIFT_WINDOW} rounds", "points": len(works), **err,
         "measured_steps": step_range(works)},
    )  # fmt: skip
    no_drift = measured_spec(f"{name}-no-drift", coef_nd, {**spec.fit, **err_nd,
                             "method": "engine step trace, NNLS on seconds, no drift factor"})  # fmt: skip
    no_drift.fit.pop("interval", None)
    no_drift.fit.pop("speed_drift", None)
    labels = [f.label() for f in fits]
    labels += [f"{check.workload} {s}" for check, s, _ in held]
    trace = [
        {"label": lab, "config": job[1], "shapes": c.shapes, "times": [d for _, d in c.steps],
         "host": c.host_s}
        for lab, job, c in zip(labels, jobs + [j for _, _, j in held], clocks, strict=True)
    ]  # fmt: skip
    fitted = CostModel(_cost_model_config(model), spec, dtype)
    return Calibration(spec, works, times, [fitted.time_of(w) for w in works], no_drift, trace)


def measured_spec(name: str, coef, fit: dict) -> HardwareSpec:
    """A hardware spec that is a measured step-time fit: only the linear terms count."""
    return HardwareSpec(
        name,
        peak_flops=1.0,
        mem_bw=1.0,
        mem_gb=2.0,
        flops_efficiency=1.0,
        bw_efficiency=1.0,
        gpu_memory_utilization=1.0,
        linear=coef,
        fit=fit,
    )


def _cost_model_config(model: str):
    from cbbench.reference_engine.model.config import resolve_model_config

    return resolve_model_config(model)
