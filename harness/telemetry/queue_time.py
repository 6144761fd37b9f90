"""Queue time from a server's queue-time histogram over the measured window.

The window's histogram is the bucket-wise difference of the last and first scrape; its mean
is exact (sum/count), its percentiles are estimated by linear interpolation inside the
bucket that holds the rank, as Prometheus' `histogram_quantile` does. Results carry
`method: "estimated from histogram"` so nobody mistakes them for per-request values.

How wide that guess is: the histogram only says which bucket holds each percentile, so
`bucket_s[pN]` gives that bucket's bounds (the true value lies there). And a run knows more:
a request's queue time cannot exceed its own time to first token (queued, then scheduled,
then its first token), so, request by request, queue <= TTFT, and the N-th percentile of
queue times is at most the N-th percentile of TTFT. `bound_by_records` caps each estimate and
its bucket there (`capped_by`), which matters when a percentile falls in a wide top bucket:
interpolating inside [2.5 s, 5 s] can report 4.2 s while no request waited that long.
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


def bucket_bounds(hist: Histogram, q: float) -> tuple[float, float] | None:
    """[lower, upper] of the bucket that holds the q-quantile (upper is inf in +Inf)."""
    total = hist.buckets[-1][1] if hist.buckets else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for le, cum in hist.buckets:
        if cum >= rank and cum > below:
            return (min(lower, le), le)
        lower, below = le, cum
    return (lower, math.inf)


def bound_by_records(est: dict, ttft_s: dict) -> dict:
    """Cap a window's estimate with the run's own TTFT percentiles (`describe_array` of the
    successful requests' TTFT, seconds): queue time <= TTFT request by request, so each
    percentile and its bucket's upper bound are at most TTFT's same percentile. Returns a
    new dict; `capped_by` names the bound and which percentiles it lowered."""
    out = dict(est)
    if not ttft_s or not ttft_s.get("count"):
        return out
    lowered = []
    buckets = dict(out.get("bucket_s") or {})
    for p in QUANTILES:
        key, cap = f"p{p}", ttft_s.get(f"p{p}")
        if cap is None:
            continue
        if out.get(key) is not None and out[key] > cap:
            out[key] = cap
            lowered.append(key)
        if buckets.get(key) is not None:
            lo, hi = buckets[key]
            buckets[key] = [min(lo, cap), min(hi, cap)]
    out["bucket_s"] = buckets
    out["capped_by"] = {"bound": "client TTFT, same percentile", "lowered": lowered}
    return out


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
    buckets = {f"p{p}": bucket_bounds(hist, p / 100.0) for p in QUANTILES}
    out["bucket_s"] = {k: list(v) for k, v in buckets.items() if v is not None}
    return out
