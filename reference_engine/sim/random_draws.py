"""Validation on workloads drawn at random: `cbbench calibrate --validate-random K`.

A draw is a small closed workload (all requests at time 0) from a wide family: prompt and
output lengths each from one of five shapes (constant, uniform, lognormal, bimodal,
exponential) at a scale drawn log-uniformly (prompts 12-480 tokens, outputs 6-200), 3-48
requests, B in 1..16, sometimes a shared system prompt with prefix caching on, sometimes a
KV pool small enough that continuous batching preempts, sometimes a small token budget per
step so prompts are chunked at admission. Draw i of seed S comes from
numpy.random.default_rng([S, i]) alone, so one failing draw reruns by its (S, i)
(`--random-seed S --draws i`). The draws are trimmed to a budget of prompt and output tokens
per batch slot, so K = 12 finishes in minutes on one CPU thread with the small model.

Each draw is a validation.Validation (static and continuous, real and simulated on the same
KV pool and prefix settings); `summarize` gives the error distribution per scheduler.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.sim.calibration import PREFIX_BLOCK, engine_config
from cbbench.reference_engine.sim.validation import Validation, ValidationRow
from cbbench.workloads.spec import RequestSpec

SHAPES = ("constant", "uniform", "lognormal", "bimodal", "exponential")
BATCH_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
PROMPT_SCALE = (12, 480)  # median prompt tokens, drawn log-uniformly
OUTPUT_SCALE = (6, 200)  # median output tokens
NUM_REQUESTS = (3, 48)
MAX_PROMPT, MAX_OUTPUT = 1536, 512
# budget per draw (keeps K = 12 in minutes): output tokens and prompt tokens
OUTPUT_BUDGET = (240, 110)  # 240 + 110 x B output tokens
PROMPT_BUDGET = 6000


@dataclass(frozen=True)
class Draw:
    """One random workload and its engine settings; `requests()` rebuilds it exactly."""

    seed: int
    index: int
    num_requests: int
    batch_size: int
    prompt: tuple  # (shape, median) as drawn
    output: tuple
    prefix_tokens: int = 0  # shared system prompt (prefix caching on when > 0)
    kv_fraction: float | None = None  # continuous: KV pool as a fraction of what B needs
    token_budget: int = 8192  # continuous: max_num_batched_tokens (small: chunked prefill)
    lengths: tuple[tuple[int, int], ...] = field(default=(), repr=False)

    def requests(self) -> list[RequestSpec]:
        pre = tuple(range(self.prefix_tokens // PREFIX_BLOCK))
        return [
            RequestSpec(i, p, o, prefix_ids=pre)
            for i, (p, o) in enumerate(self.lengths[: self.num_requests])
        ]

    @property
    def max_model_len(self) -> int:
        longest = max(p + o for p, o in self.lengths[: self.num_requests])
        return -(-longest // 16) * 16

    def label(self) -> str:
        return f"{self.seed}:{self.index}"

    def describe(self) -> str:
        """One line: everything that makes the draw, for the report."""
        reqs = self.requests()
        ps = sorted(r.prompt_len for r in reqs)
        os_ = sorted(r.output_len for r in reqs)
        parts = [
            f"{self.num_requests} req", f"B={self.batch_size}",
            f"prompt {self.prompt[0]} ~{self.prompt[1]} ({ps[0]}-{ps[-1]})",
            f"output {self.output[0]} ~{self.output[1]} ({os_[0]}-{os_[-1]})",
        ]  # fmt: skip
        if self.prefix_tokens:
            parts.append(f"prefix cache {self.prefix_tokens} shared")
        if self.kv_fraction is not None:
            parts.append(f"KV {self.kv_fraction:.0%}")
        if self.token_budget < 8192:
            parts.append(f"chunk {self.token_budget}")
        return ", ".join(parts)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("lengths")
        d["rerun"] = f"--random-seed {self.seed} --draws {self.index}"
        return d


def _lengths(rng: np.random.Generator, shape: str, median: float, n: int, cap: int) -> np.ndarray:
    if shape == "constant":
        x = np.full(n, median)
    elif shape == "uniform":
        x = rng.uniform(0.2 * median, 1.8 * median, n)
    elif shape == "lognormal":
        x = median * np.exp(rng.normal(0.0, rng.uniform(0.4, 1.0), n))
    elif shape == "bimodal":  # a short and a long mode, 4x apart, around the median
        long = rng.random(n) < rng.uniform(0.2, 0.5)
        x = np.where(long, 2.0 * median, 0.5 * median) * rng.uniform(0.8, 1.2, n)
    elif shape == "exponential":
        x = rng.exponential(median / math.log(2), n)
    else:
        raise EngineError(f"unknown length shape {shape!r}")
    return np.clip(np.rint(x), 2, cap).astype(int)


def draw(seed: int, index: int) -> Draw:
    """Draw `index` of the family under `seed` (independent of the other draws)."""
    rng = np.random.default_rng([seed, index])

    def log_uniform(lo: float, hi: float) -> float:
        return math.exp(rng.uniform(math.log(lo), math.log(hi)))

    b = int(rng.choice(BATCH_SIZES))
    n = int(round(log_uniform(*NUM_REQUESTS)))
    prompt = (str(rng.choice(SHAPES)), int(round(log_uniform(*PROMPT_SCALE))))
    output = (str(rng.choice(SHAPES)), int(round(log_uniform(*OUTPUT_SCALE))))
    prefix = int(rng.integers(1, 4)) * PREFIX_BLOCK if rng.random() < 0.3 else 0
    kv = round(float(rng.uniform(0.3, 0.7)), 2) if rng.random() < 0.3 else None
    budget = int(rng.choice((128, 256, 512))) if rng.random() < 0.3 else 8192
    ps = _lengths(rng, *prompt, NUM_REQUESTS[1], MAX_PROMPT)
    os_ = _lengths(rng, *output, NUM_REQUESTS[1], MAX_OUTPUT)
    ps = np.maximum(ps, prefix + 4) if prefix else np.maximum(ps, 4)
    lengths = tuple((int(p), int(o)) for p, o in zip(ps, os_, strict=True))
    # trim to the budget (at least 2 requests): real runs of seconds, not minutes
    out_cap, pre_cap = OUTPUT_BUDGET[0] + OUTPUT_BUDGET[1] * b, PROMPT_BUDGET
    k = n
    while k > 2 and (sum(o for _, o in lengths[:k]) > out_cap
                     or sum(p for p, _ in lengths[:k]) > pre_cap):  # fmt: skip
        k -= 1
    return Draw(seed, index, k, b, prompt, output, prefix, kv, budget, lengths)


def draws(seed: int, k: int, only: list[int] | None = None) -> list[Draw]:
    if k < 1:
        raise EngineError(f"--validate-random must be >= 1, got {k}")
    idx = list(range(k)) if only is None else only
    if any(i < 0 for i in idx):
        raise EngineError(f"--draws: indices must be >= 0, got {idx}")
    return [draw(seed, i) for i in idx]


class DrawCheck(Validation):
    """A Validation of one Draw: its requests, its B, its KV pool (continuous: the draw's
    fraction of what its B longest requests need, at least one longest request + 1 block),
    prefix caching and token budget; real and simulated runs get the same settings."""

    def __init__(self, d: Draw, model: str, clock: str = "cpu", dtype: str = "float32",
                 log=print) -> None:  # fmt: skip
        self.model, self.clock, self.dtype, self.log = model, clock, dtype, log
        self.draw = d
        self.workload = f"draw {d.label()}"
        self.batch_size, self.max_model_len = d.batch_size, d.max_model_len
        per_seq = -(-d.max_model_len // EngineConfig().block_size)
        self.num_kv_blocks = d.batch_size * per_seq
        self.kv_continuous = self.num_kv_blocks
        if d.kv_fraction is not None:  # of what its B longest requests need together
            bs = EngineConfig().block_size
            need = sorted((-(-(r.prompt_len + r.output_len) // bs) for r in d.requests()),
                          reverse=True)[: d.batch_size]  # fmt: skip
            self.kv_continuous = max(per_seq + 1, int(d.kv_fraction * sum(need)))
        self.requests = d.requests()
        self.schedulers = ("static", "continuous")
        self.real = {}
        self.replay_kwargs = {"prefix_block_size": PREFIX_BLOCK}
        self._warm = False

    def _config(self, scheduler: str, executor: str, hardware: str) -> EngineConfig:
        kv = self.kv_continuous if scheduler == "continuous" else self.num_kv_blocks
        cfg = engine_config(self.model, scheduler, self.batch_size, self.max_model_len,
                            executor, hardware, self.dtype, kv)  # fmt: skip
        cont = replace(cfg.continuous, max_num_batched_tokens=max(self.draw.token_budget,
                                                                  self.batch_size))  # fmt: skip
        return replace(cfg, continuous=cont, enable_prefix_caching=self.draw.prefix_tokens > 0)


def _q(vals: list[float], q: float) -> float:
    return float(np.quantile(np.asarray(vals), q))


def summarize(rows: list[ValidationRow], attr: str = "throughput_error") -> dict[str, dict]:
    """Per scheduler: median, p90 and max of |error| (`attr` of each row), the signed
    median and the worst draw."""
    out = {}
    for s in dict.fromkeys(r.scheduler for r in rows):
        mine = [r for r in rows if r.scheduler == s]
        errs = [getattr(r, attr) for r in mine]
        absd = [abs(e) for e in errs]
        worst = max(range(len(mine)), key=lambda i: absd[i])
        out[s] = {
            "draws": len(mine),
            "median_abs": _q(absd, 0.5),
            "p90_abs": _q(absd, 0.9),
            "max_abs": max(absd),
            "median": _q(errs, 0.5),
            "worst_draw": mine[worst].workload,
        }
    return out


@dataclass
class DrawResult:
    """One draw x scheduler: the row on the fit, the row on the fit without drift factors,
    and the fit's prediction interval for the simulated figures."""

    draw: Draw
    row: ValidationRow
    no_drift: ValidationRow | None
    tok_s_interval: tuple[float, float] | None
    p99_interval: tuple[float, float] | None

    @property
    def covered(self) -> bool | None:
        if self.tok_s_interval is None:
            return None
        lo, hi = self.tok_s_interval
        return lo <= self.row.real_throughput <= hi

    @property
    def p99_covered(self) -> bool | None:
        if self.p99_interval is None:
            return None
        lo, hi = self.p99_interval
        return lo <= self.row.real_e2e_p99 <= hi

    def to_dict(self) -> dict:
        d = {"draw": self.draw.to_dict(), **self.row.to_dict(),
             "drift_free_error": self.row.drift_free_error}  # fmt: skip
        if self.no_drift is not None:
            d["no_drift_throughput_error"] = self.no_drift.throughput_error
        d["output_tok_s_interval"] = self.tok_s_interval
        d["e2e_p99_interval"] = self.p99_interval
        d["covered"], d["p99_covered"] = self.covered, self.p99_covered
        return d


def compare_draws(checks: list[DrawCheck], spec, no_drift=None) -> list[DrawResult]:
    """Simulate every draw on `spec` (and on `no_drift`, the same fit without drift
    factors) and compare with its real runs; intervals from `spec.fit` (intervals.py)."""
    from cbbench.reference_engine.sim.intervals import interval_for

    speed = spec.fit.get("interval", {}).get("speed_factors")
    out = []
    for c in checks:
        rows = c.compare(spec, speed)
        nd = c.compare(no_drift, speed) if no_drift is not None else [None] * len(rows)
        for row, other in zip(rows, nd, strict=True):
            iv = interval_for(spec.fit, row.num_steps)
            out.append(DrawResult(
                c.draw, row, other,
                iv.throughput(row.sim_throughput) if iv else None,
                iv.latency(row.sim_e2e_p99) if iv else None,
            ))  # fmt: skip
    return out


def report(results: list[DrawResult]) -> dict:
    """The error distribution per scheduler (shipped fit, without drift factors, with the
    machine's drift divided out) and the intervals' coverage."""
    rows = [r.row for r in results]
    out: dict = {"throughput": summarize(rows), "drift_free": summarize(rows, "drift_free_error"),
                 "e2e_p99": summarize(rows, "e2e_p99_error")}  # fmt: skip
    if all(r.no_drift is not None for r in results):
        out["no_drift"] = summarize([r.no_drift for r in results if r.no_drift is not None])
    cov = [r for r in results if r.covered is not None]
    if cov:
        for s in dict.fromkeys(r.row.scheduler for r in cov):
            mine = [r for r in cov if r.row.scheduler == s]
            out["throughput"][s]["covered"] = sum(bool(r.covered) for r in mine)
            out["e2e_p99"][s]["covered"] = sum(bool(r.p99_covered) for r in mine)
    return out
