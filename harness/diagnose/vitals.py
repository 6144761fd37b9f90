"""The numbers to look at first (the seed's advice before any tuning): running and waiting
requests, TTFT and TPOT, device utilization and memory, KV usage, queue time. Absent where
the run did not record them, never zero."""

from __future__ import annotations

import numpy as np
from cbbench.harness.diagnose.base import RunView, ms, pct


def _p(arr: np.ndarray, q: float) -> float | None:
    arr = arr[~np.isnan(arr)]
    return float(np.percentile(arr, q)) if arr.size else None


def vitals(v: RunView) -> dict:
    out: dict = {}
    for name in ("running", "waiting", "kv_usage", "batch_occupancy"):
        _, s = v.busy_series(name)
        if s.size:
            out[name] = {"mean": float(s.mean()), "max": float(s.max())}
    _, util = v.busy_series("util_gpu", "gpu")
    if util.size:
        out["gpu_util"] = {"mean": float(util.mean() / 100), "max": float(util.max() / 100)}
    _, used = v.busy_series("mem_used_bytes", "gpu")
    _, total = v.busy_series("mem_total_bytes", "gpu")
    if used.size and total.size:
        out["gpu_mem"] = {"max": float(used.max() / max(total.max(), 1.0))}
    for key, col in (("ttft_s", "ttft_s"), ("tpot_s", "tpot_s"), ("queue_s", "server_queue_s")):
        arr = v.col(col)
        if (~np.isnan(arr)).any():
            out[key] = {"p50": _p(arr, 50), "p99": _p(arr, 99)}
    return out


def vitals_line(d: dict) -> str:
    """One line: what a person checks first."""
    parts = []
    if "running" in d:
        parts.append(f"running {d['running']['mean']:.1f} (max {d['running']['max']:.0f})")
    if "waiting" in d:
        parts.append(f"waiting {d['waiting']['mean']:.1f} (max {d['waiting']['max']:.0f})")
    for key, title in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("queue_s", "queue")):
        if key in d:
            parts.append(f"{title} p50 {ms(d[key]['p50'])} p99 {ms(d[key]['p99'])}")
    if "kv_usage" in d:
        parts.append(f"KV max {pct(d['kv_usage']['max'])}")
    if "batch_occupancy" in d:
        parts.append(f"batch occupancy {pct(d['batch_occupancy']['mean'])}")
    if "gpu_util" in d:
        parts.append(f"GPU util {pct(d['gpu_util']['mean'])}")
    if "gpu_mem" in d:
        parts.append(f"GPU memory max {pct(d['gpu_mem']['max'])}")
    return "; ".join(parts) or "no latency or telemetry recorded"
