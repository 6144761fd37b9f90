"""Repeated runs: each figure's mean over N runs with a confidence interval and the
coefficient of variation, and whether two configurations can be told apart.

The interval is Student's t over the run means: mean +- t(1 - (1 - C) / 2, N - 1) x s / sqrt(N),
s the sample standard deviation of the N per-run figures (each run is one draw of the whole
system: server state, scheduling, noise), C the confidence (default 95 %). The CV is s / mean.
Two configurations differ only when Welch's t-interval of the difference of their means
excludes 0 (and the difference passes any practical threshold given); else "cannot tell".
This is what AIPerf's multi-run intervals and vLLM's `--num-runs` CV report; one run's
bootstrap (`gate` on single runs) sees only the noise between requests, not between runs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from cbbench.harness.conclusions.stats import t_ppf

CONFIDENCE = 0.95
REPEATS_FILE = "repeats.json"  # a --repeats folder's index: its runs and the aggregate
# (figure key, where in a summary, unit, higher is better)
FIGURES: tuple[tuple[str, tuple[str, ...], str, bool], ...] = (
    ("request_throughput", ("request_throughput",), "req/s", True),
    ("output_throughput", ("output_throughput",), "tok/s", True),
    ("ttft_mean", ("ttft_s", "mean"), "s", False),
    ("ttft_p50", ("ttft_s", "p50"), "s", False),
    ("ttft_p99", ("ttft_s", "p99"), "s", False),
    ("tpot_mean", ("tpot_s", "mean"), "s", False),
    ("tpot_p50", ("tpot_s", "p50"), "s", False),
    ("tpot_p99", ("tpot_s", "p99"), "s", False),
    ("itl_p50", ("itl_s", "p50"), "s", False),
    ("e2e_mean", ("e2e_s", "mean"), "s", False),
    ("e2e_p99", ("e2e_s", "p99"), "s", False),
)
UNITS = {k: u for k, _, u, _ in FIGURES}
HIGHER_IS_BETTER = {k: h for k, _, _, h in FIGURES}


@dataclass
class Interval:
    n: int
    mean: float
    low: float
    high: float
    sd: float
    cv: float | None  # sd / mean
    values: list[float]
    confidence: float = CONFIDENCE

    def to_dict(self) -> dict:
        return asdict(self)


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval | None:
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    if not v:
        return None
    m = statistics.fmean(v)
    if len(v) < 2:
        return Interval(1, m, math.nan, math.nan, math.nan, None, v, confidence)
    sd = statistics.stdev(v)
    half = t_ppf(1 - (1 - confidence) / 2, len(v) - 1) * sd / math.sqrt(len(v))
    cv = sd / m if m else None
    # every figure here is a latency or a rate: of values that cannot be negative, the
    # interval stops at 0 ("ttft_p99 21.27 ms [-5.74, 48.29]" over 3 noisy repeats)
    low = max(0.0, m - half) if min(v) >= 0 else m - half
    return Interval(len(v), m, low, m + half, sd, cv, v, confidence)


def figure(summary: dict, path: tuple[str, ...]) -> float | None:
    x: object = summary
    for key in path:
        if not isinstance(x, dict):
            return None
        x = x.get(key)
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return float(x)
    return None


def lead_summary(summary: dict) -> dict:
    """The figures a run's summary leads with: its window's when it chose one, else its own."""
    wf = summary.get("window_figures")
    return wf if isinstance(wf, dict) and summary.get("lead") not in (None, "all") else summary


def aggregate(summaries: Sequence[dict], confidence: float = CONFIDENCE) -> dict[str, dict]:
    """Each figure over the runs (their lead figures): mean, interval, CV, the values."""
    out: dict[str, dict] = {}
    for key, path, _, _ in FIGURES:
        iv = t_interval([figure(lead_summary(s), path) for s in summaries], confidence)
        if iv is not None:
            out[key] = iv.to_dict()
    return out


@dataclass
class Difference:
    figure: str
    a_mean: float
    b_mean: float
    ratio: float  # b / a
    low: float  # Welch interval of (b - a) / a
    high: float
    verdict: str  # "cannot tell" | "higher" | "lower"

    def to_dict(self) -> dict:
        return asdict(self)


def compare(
    a: Sequence[float], b: Sequence[float], name: str = "", confidence: float = CONFIDENCE
) -> Difference | None:
    """Welch's t-interval of mean(b) - mean(a), relative to mean(a): "cannot tell" when it
    holds 0."""
    a = [float(x) for x in a if x is not None]
    b = [float(x) for x in b if x is not None]
    if len(a) < 2 or len(b) < 2:
        return None
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        df = float(len(a) + len(b) - 2)
    else:
        df = (va + vb) ** 2 / (
            (va**2 / (len(a) - 1) if va else 0.0) + (vb**2 / (len(b) - 1) if vb else 0.0)
        )
    half = t_ppf(1 - (1 - confidence) / 2, max(1.0, df)) * se
    d = mb - ma
    lo, hi = d - half, d + half
    if min(a + b) >= 0 and ma > 0:  # b's mean cannot fall below 0: a change of -103 % read
        lo = max(lo, -ma)
    verdict = "cannot tell" if lo <= 0 <= hi else ("higher" if d > 0 else "lower")
    scale = abs(ma) if ma else 1.0
    return Difference(name, ma, mb, mb / ma if ma else math.nan, lo / scale, hi / scale, verdict)
