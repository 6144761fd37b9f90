"""Intervals over independent replicates, and the verdicts `cbbench reproduce` draws from them.

A replicate is one workload seed: the same conditions (model, device, pool, B,
max_model_len), a fresh request set, static and continuous both run on it (paired). The
gain of a replicate is continuous / static over its steady window; the interval is the 95 %
Student-t interval of the mean gain across replicates. Replicates are independent and
identically distributed by construction, so the t-interval is the textbook one; with the
few replicates a run can afford, a bootstrap over them would undercover, and intervals from
the throughput windows of a single run treat correlated stretches of one run as
independent and say nothing about another request set.

A verdict follows the interval, never the point estimate: a claim "holds" only when the
whole interval lies inside its tolerance band, "does not hold" when the whole interval lies
outside it, and is "not resolved with N replicates" otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

# two-sided 95 % Student t quantiles, df 1..30 (df > 30: the normal 1.96 is within 4 %)
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip

METHOD = "95 % Student-t interval of the mean over independent replicates (workload seeds)"
HOLDS = "holds"
DOES_NOT_HOLD = "does not hold"


def t95(df: int) -> float:
    assert df >= 1
    return _T95[df - 1] if df <= len(_T95) else 1.96


@dataclass(frozen=True)
class Interval:
    """mean ± half_width over n replicates; half_width is nan for a single replicate."""

    mean: float
    half_width: float
    n: int
    values: tuple[float, ...] = ()
    method: str = METHOD

    @property
    def lo(self) -> float:
        return self.mean - self.half_width if self.n > 1 else math.nan

    @property
    def hi(self) -> float:
        return self.mean + self.half_width if self.n > 1 else math.nan

    @property
    def resolved(self) -> bool:
        return self.n > 1 and math.isfinite(self.half_width)

    def to_json(self) -> dict:
        d = asdict(self)
        d["values"] = list(self.values)
        d.update(lo=self.lo, hi=self.hi)
        return d

    def text(self, spec: str = ".2f", unit: str = "") -> str:
        """'2.28 ± 0.10x', or '3.09x (1 replicate, no interval)': the unit on the number."""
        if not self.resolved:
            return f"{format(self.mean, spec)}{unit} (1 replicate, no interval)"
        return f"{format(self.mean, spec)} ± {format(self.half_width, spec)}{unit}"


def t_interval(values: Sequence[float]) -> Interval:
    """Mean and 95 % half-width of the mean (Student t, n - 1 degrees of freedom)."""
    n = len(values)
    assert n >= 1, "an interval needs at least one replicate"
    mean = math.fsum(values) / n
    if n < 2:
        return Interval(mean, math.nan, 1, tuple(values))
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    return Interval(mean, t95(n - 1) * sd / math.sqrt(n), n, tuple(values))


def not_resolved(n: int) -> str:
    return f"not resolved with {n} replicate{'s' if n != 1 else ''}"


def band_verdict(iv: Interval, lo: float, hi: float) -> str:
    """Is the quantity inside [lo, hi]? holds / does not hold / not resolved with N."""
    assert lo <= hi
    if not iv.resolved:
        return not_resolved(iv.n)
    if lo <= iv.lo and iv.hi <= hi:
        return HOLDS
    if iv.hi < lo or iv.lo > hi:
        return DOES_NOT_HOLD
    return not_resolved(iv.n)


def ratio_verdict(iv: Interval, target: float, tolerance: float) -> str:
    """Is the quantity within `tolerance` (relative) of `target`? On does-not-hold, says
    where the interval lies as a share of the target."""
    v = band_verdict(iv, target * (1 - tolerance), target * (1 + tolerance))
    if v == DOES_NOT_HOLD:
        side = "larger" if iv.lo > target else "smaller"
        return f"{v}: {side}, {iv.lo / target:.0%}-{iv.hi / target:.0%} of {target:.2f}x"
    return v


def order_verdict(ivs: Sequence[Interval]) -> str:
    """Is ivs[0] < ivs[1] < ... ? holds when every neighbouring pair's intervals are apart
    in that order, does not hold when some pair's are apart in the other order."""
    n = min(iv.n for iv in ivs)
    if not all(iv.resolved for iv in ivs):
        return not_resolved(n)
    pairs = list(zip(ivs, ivs[1:], strict=False))
    if any(a.lo > b.hi for a, b in pairs):
        return DOES_NOT_HOLD
    if all(a.hi < b.lo for a, b in pairs):
        return HOLDS
    return not_resolved(n)
