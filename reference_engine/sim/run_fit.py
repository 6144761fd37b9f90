"""Fitting the simulator's step-time model to a server it does not control, from what a
benchmark run saw of each request: when it was sent, its first and last token times and its
prompt and output token counts.

The server's batching is not visible from outside, so the simulator replays the run's
arrivals with the server's batching settings (max_num_seqs, token budget, chunked prefill,
KV blocks) and reconstructs it. Then, a few rounds of:

1. simulate the runs with the current coefficients, recording every step's chunks;
2. per request, two equations linear in the coefficients: its decode time (first -> last
   token) is the sum of the features (RUN_TERMS) of the steps between its first and last
   token, and its TTFT is a per-request overhead (`c_req`: HTTP, tokenizing, the network)
   plus the rest of the step in progress when it arrived and every step up to its first
   token; decode rows divided by (output - 1) (TPOT), each group scaled by its mean; and
   each gap between two tokens whose steps in the replay carry no prefill chunk. A gap that
   spans one is left out: which decode gap another request's prefill lands in depends on
   its arrival as reconstructed (send, overhead, the server's scheduling), right to a step
   or so; a misplaced chunk makes a short gap predicted long, a long one an "outlier";
3. non-negative least squares over the requests of the fit part, robust (Huber weights,
   re-weighted a few times: a server's rare stalls must not move the step terms), damped
   towards the last coefficients; keep the round whose simulation matched the fit part best.

The overhead outside the steps need not be constant: a front end that shares the machine
with its engine (tokenizing, detokenizing every running stream) slows as the load grows, so
a request's overhead is `c_req + c_req_load * in_flight`, in_flight the requests the client
had in flight when it sent it (measured in the fitted runs; simulated when predicting). The
fit part: the requests sent in the first (1 - holdout) of each run; the rest is held back
(its error: the fit's measured error, what `plan` / `sim` intervals use). Last, the step
jitter (execution/step_jitter.py): the fitted replay's one-step decode gaps against the
measured; the errors reported replay with it.

Over 400 lines because the replay (its step log), the rounds and the jitter's samples share
the replay's internals; what needs none of them is in run_fit_terms.py.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.cost_model import HardwareSpec, StepWork, nnls
from cbbench.reference_engine.execution.step_jitter import describe as describe_jitter
from cbbench.reference_engine.execution.step_jitter import fit_jitter
from cbbench.reference_engine.sim.run_fit_terms import (  # noqa: F401 (SETTINGS, engine_config: re-exported)
    SETTINGS,
    engine_config,
    fit_part,
    identifiability,
    in_flight,
    initial_coef,
    jitter_ratios,
    overheads,
    robust_solve,
    vocab_size,
    warm_prefix,
    what_runs_cannot_tell,
)
from cbbench.reference_engine.sim.step_range import step_range
from cbbench.workloads.spec import RequestSpec

# what a black-box fit can see: per step, batched token, sequence, decode context token,
# prefill (query x context) pair; the server's settings it replays the runs with
RUN_TERMS = ("c0", "c_tok", "c_seq", "c_dec_kv", "c_pre_ctx")
OVERHEAD_TERMS = ("c_req", "c_req_load")  # per request; and per request in flight at its send
METRICS = ("ttft", "tpot", "e2e")
JITTER_MARGIN = 2  # steps kept clear of a prefill chunk for a gap to price the jitter


@dataclass(frozen=True)
class Observed:  # one measured request: times in seconds from the run's start
    sent_s: float
    prompt_len: int
    output_len: int  # tokens it got
    ttft_s: float
    e2e_s: float
    # where the run has them: the server's own TTFT (queue + prefill: arrival at the engine ->
    # first token) and the client's gaps between tokens
    server_ttft_s: float | None = None
    itl_s: tuple[float, ...] = ()
    # prompt tokens the server served from its prefix cache (it said so, or it had seen the
    # prompt before): the replay starts with their blocks cached, so only the rest is prefilled
    cached_tokens: int = 0

    @property
    def tpot_s(self) -> float | None:
        n = self.output_len
        return (self.e2e_s - self.ttft_s) / (n - 1) if n > 1 else None


@dataclass
class ObservedRun:  # one run's measured requests, and what the server's series said
    name: str
    requests: list[Observed]
    num_preemptions: int | None = None  # what the server said, if anything
    running_mean: float | None = None  # the server's running-requests series, if sampled


@dataclass
class Predicted:  # the simulation of one run: per request (the run's order), then totals
    ttft_s: list[float]
    e2e_s: list[float]
    tpot_s: list[float | None]
    num_preemptions: int
    max_running: int
    budget_bound_steps: int  # steps that used the whole token budget
    running_mean: float = 0.0  # requests running, averaged over the run's time


@dataclass
class RunFit:
    coef: dict[str, float]  # RUN_TERMS and OVERHEAD_TERMS
    predicted: list[Predicted]
    errors: dict[str, dict[str, float]]  # "fit" / "held_back" / "all" -> metric_stat -> rel err
    rounds: list[dict] = field(default_factory=list)  # per round: coef, fit-part error
    # the step jitter (execution/step_jitter.py): None where too few one-step gaps
    jitter: dict | None = None
    jitter_gaps: int = 0  # one-step decode gaps it was (or would have been) fitted on
    identified: dict[str, str] = field(default_factory=dict)  # term -> verdict
    notes: list[str] = field(default_factory=list)  # what the runs cannot tell
    # the largest step and batch of the runs' replay (sim/step_range.py): what the fit saw
    measured_steps: dict = field(default_factory=dict)


class _StepLog:
    """Wraps a SimExecutor's `run`: every step's (start, end, work, [(request, samples)]).
    `warm`: (prompt ids, tokens) whose leading full blocks are in the prefix cache before
    the first step (what the server had cached from before the run)."""

    def __init__(self, warm: list[tuple[list[int], int]] = ()) -> None:
        self.steps: list[tuple[float, float, StepWork, list[tuple[str, bool]]]] = []
        self.warm = list(warm)

    def __call__(self, ex, engine):
        for i, (ids, n) in enumerate(self.warm):
            warm_prefix(engine.block_manager, f"warm-{i}", ids, n)
        inner = ex.run

        def run(step):
            t0 = ex.clock
            out = inner(step)
            work = ex.cost_model.work((start, n + len(spec), s) for _, start, n, spec, s, _ in step)
            self.steps.append((t0, ex.clock, work, [(rid, s) for rid, _, _, _, s, _ in step]))
            return out

        ex.run = run
        return ex


def simulate_run(
    run: ObservedRun, model: str, dtype: str, settings: dict, coef: dict[str, float],
    hardware: str | None = None, jitter: dict | None = None,
) -> tuple[Predicted, _StepLog, list]:
    """Replay the run's sends (each shifted by its overhead) with `coef` as the step model
    (or, given, `hardware`: a preset or hardware JSON; `coef` then gives the overhead only),
    each step's time times a draw from `jitter` where given (the fit's rounds: none).
    With a load-dependent overhead, the load is the simulation's own: a first pass with the
    constant part gives the requests in flight, the second pass uses them."""
    load = np.zeros(len(run.requests))
    pred, log, sim_reqs = _simulate_once(run, model, dtype, settings, coef, load, hardware,
                                         jitter)  # fmt: skip
    if coef.get("c_req_load", 0.0) > 0:
        load = in_flight([r.sent_s for r in run.requests], pred.e2e_s)
        pred, log, sim_reqs = _simulate_once(run, model, dtype, settings, coef, load, hardware,
                                         jitter)  # fmt: skip
    return pred, log, sim_reqs


def _simulate_once(run: ObservedRun, model: str, dtype: str, settings: dict,
                   coef: dict[str, float], load: np.ndarray,
                   hardware: str | None = None,
                   jitter: dict | None = None) -> tuple[Predicted, _StepLog, list]:  # fmt: skip
    from cbbench.reference_engine.sim.simulate import prompt_tokens, simulate

    extra = overheads(coef, load)
    reqs = [RequestSpec(i, max(1, r.prompt_len), max(1, r.output_len),
                        arrival_s=r.sent_s + float(extra[i]))
            for i, r in enumerate(run.requests)]  # fmt: skip
    warm = [(prompt_tokens(q, vocab_size(model)), r.cached_tokens)
            for q, r in zip(reqs, run.requests, strict=True) if r.cached_tokens > 0]  # fmt: skip
    if warm:  # the server said (or had seen) prefix hits: it caches prefixes
        settings = {**settings, "enable_prefix_caching": True}
        if settings.get("num_kv_blocks") is None:  # unknown: room for the run and the warm
            bs = int(settings.get("block_size") or 16)
            pool = engine_config(model, dtype, settings, "cpu", reqs).num_kv_blocks
            settings["num_kv_blocks"] = pool + sum(n // bs for _, n in warm)
    log = _StepLog(warm)
    tp = int(settings.get("tensor_parallel_size") or 1)
    spec = HardwareSpec("run-fit", 1.0, 1.0, 1e6, flops_efficiency=1.0, bw_efficiency=1.0,
                        linear={t: coef.get(t, 0.0) for t in RUN_TERMS},
                        fit={"tensor_parallel_size": tp, **({"step_jitter": jitter} if jitter else {})})  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        hw = Path(tmp) / "hw.json"
        hw.write_text(json.dumps(spec.to_dict()), encoding="utf-8")
        res = simulate(reqs, engine_config(model, dtype, settings, hardware or str(hw), reqs),
                       wrap_executor=log)  # fmt: skip
    pred = Predicted(
        ttft_s=[r.ttft_s + float(x) for r, x in zip(res.requests, extra, strict=True)],
        e2e_s=[r.e2e_s + float(x) for r, x in zip(res.requests, extra, strict=True)],
        tpot_s=[r.tpot_s for r in res.requests],
        num_preemptions=sum(r.num_preemptions for r in res.requests),
        max_running=max((s.num_running for s in res.steps), default=0),
        budget_bound_steps=sum(
            s.num_batched_tokens >= settings.get("max_num_batched_tokens", 1 << 30)
            for s in res.steps
        ),
        running_mean=sum(s.num_running * (s.end_s - s.start_s) for s in res.steps)
        / max(res.duration_s, 1e-12),
    )
    return pred, log, res.requests


def _rows(run: ObservedRun, log: _StepLog, sim_reqs: list, use: list[bool], measured: bool,
          load: np.ndarray):  # fmt: skip
    """Row groups (rows, targets) for the requests in `use`: TTFT, TPOT and, where the run
    has token times, each gap between tokens; a row: RUN_TERMS features summed over the
    steps the measured span covers, then OVERHEAD_TERMS' columns (1, requests in flight at
    the send). With the overhead `measured` (the server's own TTFT), the TTFT rows are the
    server's, without those columns."""
    feats = np.array([w.features(RUN_TERMS) for _, _, w, _ in log.steps])
    starts = np.array([s for s, _, _, _ in log.steps])
    ends = np.array([e for _, e, _, _ in log.steps])
    samples: dict[str, list[int]] = {}
    for j, (_, _, _, items) in enumerate(log.steps):
        for rid, s in items:
            if s:
                samples.setdefault(rid, []).append(j)
    csum = np.vstack([np.zeros(len(RUN_TERMS)), np.cumsum(feats, axis=0)])
    # steps with a prefill chunk (more tokens than sequences), cumulated
    prefill = np.concatenate([[0], np.cumsum(feats[:, 1] > feats[:, 2])])
    t_rows, t_y, d_rows, d_y, g_rows, g_y = [], [], [], [], [], []
    for i, (obs, sim) in enumerate(zip(run.requests, sim_reqs, strict=True)):
        js = samples.get(sim.request_id, [])
        if not use[i] or not js:
            continue
        first, last = js[0], js[-1]
        # the step in progress at arrival: its remaining share; then every later step
        k = int(np.searchsorted(ends, sim.arrival_s, side="right"))
        row = csum[first + 1] - csum[min(k + 1, first + 1)]
        if k <= first:
            span = ends[k] - starts[k]
            share = (ends[k] - max(sim.arrival_s, starts[k])) / span if span > 0 else 1.0
            row = row + share * feats[k]
        if measured and obs.server_ttft_s is not None:
            t_rows.append(np.append(row, [0.0, 0.0]))
            t_y.append(obs.server_ttft_s)
        elif not measured:
            t_rows.append(np.append(row, [1.0, load[i]]))
            t_y.append(obs.ttft_s)
        n = obs.output_len
        if n > 1 and last > first:
            d_rows.append(np.append((csum[last + 1] - csum[first + 1]) / (n - 1), [0.0, 0.0]))
            d_y.append((obs.e2e_s - obs.ttft_s) / (n - 1))
        if len(obs.itl_s) == len(js) - 1:  # one gap per token after the first
            for k, gap in enumerate(obs.itl_s, 1):
                if prefill[js[k] + 1] != prefill[js[k - 1] + 1]:
                    continue  # it spans a prefill chunk: where the replay put it (module doc)
                g_rows.append(np.append(csum[js[k] + 1] - csum[js[k - 1] + 1], [0.0, 0.0]))
                g_y.append(gap)
    return t_rows, t_y, d_rows, d_y, g_rows, g_y


def _errors(runs: list[ObservedRun], preds: list[Predicted], parts: list[list[bool]],
            which: bool | None) -> dict[str, float]:  # fmt: skip
    """Relative errors (predicted / measured - 1) of the means and p99s of TTFT, TPOT and
    E2E over the requests of every run whose part flag is `which` (None: all)."""
    meas: dict[str, list[float]] = {m: [] for m in METRICS}
    pred: dict[str, list[float]] = {m: [] for m in METRICS}
    for run, p, part in zip(runs, preds, parts, strict=True):
        for i, r in enumerate(run.requests):
            if which is not None and part[i] != which:
                continue
            for m, mv, pv in (("ttft", r.ttft_s, p.ttft_s[i]), ("tpot", r.tpot_s, p.tpot_s[i]),
                              ("e2e", r.e2e_s, p.e2e_s[i])):  # fmt: skip
                if mv is not None and pv is not None:
                    meas[m].append(mv)
                    pred[m].append(pv)
    out: dict[str, float] = {}
    for m in METRICS:
        if len(meas[m]) < 2:
            continue
        out[f"{m}_mean"] = float(np.mean(pred[m]) / np.mean(meas[m]) - 1.0)
        out[f"{m}_p99"] = float(np.percentile(pred[m], 99) / np.percentile(meas[m], 99) - 1.0)
    return out


def _score(err: dict[str, float]) -> float:
    """What the best round minimises: the means' errors, and half the p99s'."""
    return sum(abs(err.get(f"{m}_mean", 0.0)) + 0.5 * abs(err.get(f"{m}_p99", 0.0))
               for m in METRICS)  # fmt: skip


def fit_runs(
    runs: list[ObservedRun],
    model: str,
    dtype: str,
    settings: dict,
    holdout: float = 0.5,
    rounds: int = 12,
    damping: float = 0.5,
    log: Callable[[str], None] | None = None,
    server_ttft: bool = False,
    step_jitter: bool = False,
) -> RunFit:
    """Fit RUN_TERMS and OVERHEAD_TERMS to `runs` served with `settings` (module doc).
    `server_ttft`: fit the TTFT rows to the server's own TTFT where the runs carry it, and
    measure the overhead from what lies outside it (client TTFT less the server's: its
    constant part and its growth with the requests in flight). Off by
    default: where the server's front end shares the machine with its engine, that outside
    part grows with load, and the client's TTFT is what is predicted. `step_jitter`: also
    fit the step jitter (execution/step_jitter.py; opt-in: each jittered replay is then one
    sample, its means a few % apart between seeds)."""
    if not runs or not any(r.requests for r in runs):
        raise EngineError("calibration from runs: no successful requests to fit")
    if not 0.0 <= holdout < 1.0:
        raise EngineError(f"holdout must be in [0, 1), got {holdout}")
    parts = [fit_part(r, holdout) for r in runs]
    coef = initial_coef(runs)
    # the server's own TTFT: what lies outside its steps (HTTP, network) is measured
    outside = [r.ttft_s - r.server_ttft_s for run, part in zip(runs, parts, strict=True)
               for r, p in zip(run.requests, part, strict=True)
               if p and r.server_ttft_s is not None]  # fmt: skip
    loads = [in_flight([r.sent_s for r in run.requests], [r.e2e_s for r in run.requests])
             for run in runs]  # fmt: skip
    measured = server_ttft and len(outside) >= 2
    if measured:  # outside the engine, against the load: both measured
        load = [x for ld, part in zip(loads, parts, strict=True)
                for x, p in zip(ld, part, strict=True) if p]  # fmt: skip
        a = np.column_stack([np.ones(len(outside)), load])
        if np.ptp(load) == 0:
            a = a[:, :1]
        over = nnls(a, np.array(outside))
        coef["c_req"] = float(over[0])
        coef["c_req_load"] = float(over[1]) if len(over) > 1 else 0.0
    best: tuple[float, dict, list[Predicted]] | None = None
    history: list[dict] = []
    last_a = last_b = None
    for k in range(rounds):
        sims = [simulate_run(r, model, dtype, settings, coef) for r in runs]
        preds = [p for p, _, _ in sims]
        err = _errors(runs, preds, parts, True)
        history.append({"round": k, "coef": dict(coef), "fit_error": err})
        if log:
            log(f"  round {k + 1}: " + ", ".join(f"{m} mean {err.get(m + '_mean', 0):+.1%}"
                                                for m in METRICS))  # fmt: skip
        if best is None or _score(err) < best[0]:
            best = (_score(err), dict(coef), preds)
            seen = step_range(w for _, slog, _ in sims for _, _, w, _ in slog.steps)
        groups: list[list] = [[] for _ in range(6)]
        for r, (_, slog, sreqs), part, ld in zip(runs, sims, parts, loads, strict=True):
            rows = _rows(r, slog, sreqs, part, measured, ld)
            for g, vals in zip(groups, rows, strict=True):
                g.extend(vals)
        if not groups[2] and not groups[0]:
            raise EngineError("calibration from runs: no request of the fit part got a token")
        x, last_a, last_b = robust_solve(groups[0::2], groups[1::2])
        if measured:
            x[-2:] = coef["c_req"], coef["c_req_load"]
        new = dict(zip((*RUN_TERMS, *OVERHEAD_TERMS), map(float, x), strict=True))
        moved = max(abs(new[t] - coef.get(t, 0.0)) / max(abs(new[t]), 1e-12) for t in new)
        coef = {t: (1 - damping) * new[t] + damping * coef.get(t, 0.0) for t in new}
        if moved < 0.01:
            break
    assert best is not None
    if not measured:  # the robust loss left the stalls out; the means take them back
        best = _match_means(runs, parts, model, dtype, settings, best)
    _, coef, preds = best
    jitter, ratios = (_step_jitter(runs, parts, model, dtype, settings, coef) if step_jitter
                      else (None, []))  # fmt: skip
    if log and step_jitter:
        log(describe_jitter(jitter, len(ratios)))
    if jitter is not None:  # what is predicted (held back, p99s) carries it
        preds = [simulate_run(r, model, dtype, settings, coef, jitter=jitter)[0] for r in runs]
    fit = RunFit(coef, preds, {
        "fit": _errors(runs, preds, parts, True),
        "held_back": _errors(runs, preds, parts, False) if holdout > 0 else {},
        "all": _errors(runs, preds, parts, None),
    }, history, jitter=jitter, jitter_gaps=len(ratios))  # fmt: skip
    if last_a is not None:
        fit.identified = identifiability(last_a, last_b, coef, (*RUN_TERMS, *OVERHEAD_TERMS))
    if measured:
        for t in OVERHEAD_TERMS:
            fit.identified[t] = "measured (client TTFT less the server's own)"
    fit.notes = what_runs_cannot_tell(runs, preds, settings)
    fit.measured_steps = seen
    computed = {True: [0], False: [0]}  # prompt tokens the server computed, by part
    for run, part in zip(runs, parts, strict=True):
        for r, q in zip(run.requests, part, strict=True):
            computed[q].append(r.prompt_len - r.cached_tokens)
    if max(computed[False]) > 1.5 * max(computed[True]):
        fit.notes.append(f"prefill: the fit part's requests computed at most {max(computed[True])} "
                         f"prompt tokens, the held back up to {max(computed[False])}: their TTFT "
                         "extrapolates the prefill terms")  # fmt: skip
    return fit


def _step_jitter(runs, parts, model, dtype, settings, coef) -> tuple[dict | None, list[float]]:
    """The fitted (deterministic) replay's jitter ratios (run_fit_terms.jitter_ratios) of
    the fit part, and their distribution (execution/step_jitter.py)."""
    ratios: list[float] = []
    for run, part in zip(runs, parts, strict=True):
        _, slog, sreqs = simulate_run(run, model, dtype, settings, coef)
        ratios += jitter_ratios(run, part, slog.steps, sreqs, JITTER_MARGIN)
    return fit_jitter(ratios), ratios


def _match_means(runs, parts, model, dtype, settings, best, steps: int = 5):
    """The best round brought to the fit part's means: the step terms scaled by the
    geometric mean of its TPOT mean's ratio and its decode time's (E2E less TTFT: the long
    outputs weigh more), then c_req moved by its TTFT mean's residual. The robust loss
    sets the terms' shape and keeps a server's stalls out of it; the means (what is
    predicted) still carry the stalls' share. Kept only where it matches the fit part better."""

    def fit_mean(vals_of, part_vals) -> float:
        v = [x for vals, part in zip(part_vals, parts, strict=True)
             for x, q in zip(vals_of(vals), part, strict=True) if q and x is not None]  # fmt: skip
        return float(np.mean(v)) if v else float("nan")

    meas_tpot = fit_mean(lambda run: [r.tpot_s for r in run.requests], runs)
    meas_ttft = fit_mean(lambda run: [r.ttft_s for r in run.requests], runs)
    meas_dec = fit_mean(lambda run: [r.e2e_s - r.ttft_s for r in run.requests], runs)
    score, coef, preds = best
    out = best
    for step in range(steps):
        dec = fit_mean(lambda p: [e - t for e, t in zip(p.e2e_s, p.ttft_s, strict=True)], preds)
        k = float(np.sqrt(meas_tpot / fit_mean(lambda p: p.tpot_s, preds) * meas_dec / dec))
        if not k > 0 or (abs(k - 1) < 0.005 and step > 0):  # converged (queueing feeds back)
            break
        coef = {t: v * k if t in RUN_TERMS else v for t, v in coef.items()}
        preds = [simulate_run(r, model, dtype, settings, coef)[0] for r in runs]
        shift = meas_ttft - fit_mean(lambda p: p.ttft_s, preds)
        coef = {**coef, "c_req": max(0.0, coef.get("c_req", 0.0) + shift)}
        preds = [simulate_run(r, model, dtype, settings, coef)[0] for r in runs]
        s = _score(_errors(runs, preds, parts, True))
        if s < out[0]:
            out = (s, dict(coef), preds)
    return out
