"""Prediction intervals for a calibrated simulator's figures, from the fit's residuals.

A simulated run's time (hence its output tok/s and, to first order, its p99 E2E) is off the
real run's by a relative error e with two parts, both estimated when `cbbench calibrate`
fits (calibration.py) and stored in the hardware JSON's `fit["interval"]`:

- the step model's error on a run it was not fitted on: leave one fit run out, refit on the
  others (drift factors included) and price the left-out run's own steps against its
  measured time with the machine's drift divided out (`run_errors`); over the n fit runs
  these give a mean m and a spread s, and a new run's model error ~ m + s sqrt(1 + 1/n) t;
- the machine's speed over the run, unknown to the simulator: the fit's drift factors (one
  per window of rounds, calibration.DRIFT_WINDOW) averaged over as many consecutive windows
  as the run has steps; their spread over all starting windows is that part's spread
  (`drift_spread`).

The half-width is q = t(level, n - 1) x sqrt(s^2 (1 + 1/n) + d^2) around m, with t Student's
quantile (a small table: numpy only); real time = simulated time x (1 + e), so throughput
lies in [tok/s / (1 + m + q), tok/s / (1 + m - q)] and p99 E2E in p99 x [1 + m - q, 1 + m + q].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

LEVEL = 0.9  # two-sided coverage of the printed interval
# Student's t, 95th percentile (a two-sided 90 % interval), by degrees of freedom 1..30
_T95 = (
    6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812,
    1.796, 1.782, 1.771, 1.761, 1.753, 1.746, 1.740, 1.734, 1.729, 1.725,
    1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697,
)  # fmt: skip


def t95(df: int) -> float:
    """Student's t 0.95 quantile for `df` degrees of freedom (normal's beyond 30)."""
    assert df >= 1
    return _T95[df - 1] if df <= len(_T95) else 1.645 + 2.4 / df


def drift_spread(speed: Sequence[float], num_windows: int) -> float:
    """Standard deviation, over every start, of the mean of `num_windows` consecutive drift
    factors: how far the machine's speed over a run that long strays from the fit's mean."""
    s = np.asarray(speed, dtype=np.float64)
    if len(s) < 2:
        return 0.0
    m = max(1, min(int(num_windows), len(s)))
    if m >= len(s):
        return 0.0
    means = np.convolve(s, np.ones(m) / m, mode="valid")
    return float(np.sqrt(np.mean((means - 1.0) ** 2)))


@dataclass(frozen=True)
class Interval:
    """Relative error band of a simulated run's time: real = simulated x (1 + e), e in
    [low, high]."""

    low: float
    high: float
    level: float = LEVEL

    def throughput(self, tok_s: float) -> tuple[float, float]:
        return tok_s / (1.0 + self.high), tok_s / max(1.0 + self.low, 1e-9)

    def latency(self, seconds: float) -> tuple[float, float]:
        return seconds * max(1.0 + self.low, 0.0), seconds * (1.0 + self.high)


def interval_for(fit: dict, num_steps: int) -> Interval | None:
    """The interval of a run of `num_steps` engine steps on the fitted hardware whose fit
    record is `fit` (HardwareSpec.fit); None when the fit carries no interval data (older
    calibrations, presets without residuals)."""
    data = fit.get("interval")
    if not data or len(data.get("run_errors", ())) < 2:
        return None
    errs = np.asarray(data["run_errors"], dtype=np.float64)
    n = len(errs)
    mean, sd = float(errs.mean()), float(errs.std(ddof=1))
    windows = math.ceil(max(num_steps, 1) / data.get("window", 25))
    d = drift_spread(data.get("speed_factors", ()), windows)
    q = t95(n - 1) * math.sqrt(sd**2 * (1.0 + 1.0 / n) + d**2)
    return Interval(mean - q, mean + q)


def run_errors(
    works: list,
    times: list[float],
    host: list[float],
    rounds: list[int],
    run_of: list[int],
    window: int,
    fit,
) -> list[float]:
    """Leave-one-run-out errors of the step model: for each fit run, refit on the other
    runs with `fit` (calibration.fit_step_terms, drift factors included) and compare its
    steps' priced time with their measured time divided by the fitted drift factors of their
    windows.
    + : the model prices the run slower than it ran."""
    out = []
    for k in sorted(set(run_of)):
        keep = [i for i, r in enumerate(run_of) if r != k]
        left = [i for i, r in enumerate(run_of) if r == k]
        coef, err = fit(
            [works[i] for i in keep], [times[i] for i in keep], [host[i] for i in keep],
            [rounds[i] for i in keep], window,
        )  # fmt: skip
        speed = err.get("speed_factors") or [1.0]
        last = len(speed) - 1
        pred = sum(sum(c * works[i].feature(t) for t, c in coef.items()) for i in left)
        real = sum(times[i] / speed[min(rounds[i] // window, last)] for i in left)
        out.append(pred / real - 1.0)
    return out


# What the project measured of spec-sheet roofline presets elsewhere: `cbbench sim` with each
# GPU's spec sheet against real vLLM runs on two GPUs (Llama-3.1-8B, 300 ShareGPT requests at
# ~10 req/s; issue #53's table). A preset nothing measured gets "error unknown", this said,
# and its largest error as the band of `plan`'s verdicts.
ELSEWHERE = ("spec-sheet presets measured elsewhere (vLLM, Llama-3.1-8B, two GPUs) were off "
             "by TTFT +22 %/+32 %, TPOT +10 %/+24 %, E2E +13 %/+30 %")  # fmt: skip
UNMEASURED_BAND = 0.32


def measured_interval(fit: dict) -> Interval | None:
    """A fit or preset that carries the error it was measured with (`measured_error`:
    predicted / measured - 1 of TPOT and E2E means, say): real step time = simulated /
    (1 + error), so the band is +- the largest such correction."""
    err = fit.get("measured_error") or {}
    vals = [float(v) for k, v in err.items() if k.endswith("_mean") and v is not None
            and not k.startswith("ttft")]  # fmt: skip
    if not vals:
        return None
    band = max(abs(1.0 / (1.0 + v) - 1.0) for v in vals)
    return Interval(-band, band)


def error_of(hw) -> tuple[Interval, str, str]:
    """(interval, kind, words) for a hardware's figures: "fit" (a calibrate fit's residuals),
    "measured" (the error it was measured with) or "unknown" (neither: ELSEWHERE's band)."""
    fit = hw.fit or {}
    iv = interval_for(fit, 1000) if hw.linear is not None else None
    if iv is not None:
        return iv, "fit", "the fit's prediction interval"
    iv = measured_interval(fit)
    if iv is not None:
        where = fit.get("measured_on") or ", ".join(fit.get("runs", ())) or "its measurement"
        return iv, "measured", f"+-{iv.high:.0%} from the error measured on {where}"
    return (Interval(-UNMEASURED_BAND, UNMEASURED_BAND), "unknown",
            f"error unknown for {hw.name} (never measured against a real run); {ELSEWHERE}: "
            f"intervals use +-{UNMEASURED_BAND:.0%}")  # fmt: skip
