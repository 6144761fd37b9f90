"""The one percentile helper: mean, p50, p90, p95, p99, max, count, used by every summary
(run summaries, the engine's replay summary, reports). It lives in the lowest layer so the
harness and the engine share it (workloads/stats.py re-exports it)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

PERCENTILES = (50, 90, 95, 99)


def describe(values: Iterable[float | None]) -> dict[str, float | int | None]:
    """Summary of the non-None values; every statistic is None (absent, not zero) when empty."""
    return describe_array(np.asarray([v for v in values if v is not None], dtype=np.float64))


def describe_array(arr: np.ndarray) -> dict[str, float | int | None]:
    """`describe` on a float array; NaN means absent."""
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}, "max": None, "count": 0}
    pct = np.percentile(arr, PERCENTILES)
    return {
        "mean": float(arr.mean()),
        **{f"p{p}": float(v) for p, v in zip(PERCENTILES, pct, strict=True)},
        "max": float(arr.max()),
        "count": int(arr.size),
    }
