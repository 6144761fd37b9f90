"""Queue time from a server's queue-time histogram over the measured window.

The window's histogram is the bucket-wise difference of the last and first scrape; its mean
is exact (sum/count), its percentiles are estimated by linear interpolation inside the
bucket that holds the rank, as Prometheus' `histogram_quantile` does. Results carry
`method: "estimated from histogram"` so nobody mistakes them for per-request values.
"""

from __future__ import annotations

import math

from cbbench.harness.telemetry.prom import Histogram

METHOD = "estimated from histogram"
QUANTILES = (50, 90, 95, 99)


def histogram_delta(before: Histogram | None, after: Histogram) -> Histogram:
    """`after - before`; a counter reset (any count going down) means `after` is the window."""
    if before is None:
        return after
    prev = dict(before.buckets)
    if after.count < before.count or any(c < prev.get(le, 0.0) for le, c in after.buckets):
        return after
    return Histogram(
        buckets=[(le, c - prev.get(le, 0.0)) for le, c in after.buckets],
        sum=after.sum - before.sum,
        count=after.count - before.count,
    )


def quantile(hist: Histogram, q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation within its bucket; None when empty.

    A rank that falls in the +Inf bucket is reported as the largest finite bound (a lower
    bound on the true value), the same convention as Prometheus.
    """
    assert 0.0 <= q <= 1.0
    total = hist.buckets[-1][1] if hist.buckets else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for le, cum in hist.buckets:
        if cum >= rank and cum > below:
            if math.isinf(le):
                return lower
            if le <= 0:  # only non-positive observations below this bound
                return le
            return lower + (le - lower) * (rank - below) / (cum - below)
        lower, below = le, cum
    return lower


def estimate(hist: Histogram) -> dict:
    """Mean (exact) and p50/p90/p95/p99 (interpolated) of a window's histogram, in seconds.

    Queue times are >= 0, so by Markov's inequality the q-quantile is at most mean/(1-q);
    each percentile is capped there. That matters when every request lands in the first
    bucket (vLLM's is [0, 0.3] s): interpolation alone would spread them over the bucket.
    """
    count = int(round(hist.count))
    out: dict = {"method": METHOD, "count": count}
    mean = hist.sum / hist.count if hist.count > 0 else None
    out["mean"] = mean
    for p in QUANTILES:
        q = quantile(hist, p / 100.0)
        if q is not None and mean is not None:
            q = min(q, max(mean, 0.0) / (1.0 - p / 100.0))
        out[f"p{p}"] = q
    return out
