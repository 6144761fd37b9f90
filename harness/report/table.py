"""The summary table: one row per run, columns with a direction so the best value is marked."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from cbbench.harness.metrics import describe
from cbbench.harness.report.runs import LoadedRun
from cbbench.harness.report.samples import LATENCY_METRICS, RunSamples, extract

LATENCY_TITLES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E", "queue": "queue"}
STAT_KEYS = ("mean", "p50", "p90", "p95", "p99", "max")


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    better: str | None  # "high", "low" or None (no best marked)
    unit: str = ""  # "ms" (value in seconds, shown in ms), "%" (fraction shown as %), ""


SUMMARY_COLUMNS: tuple[Column, ...] = (
    Column("requests", "requests ok", None),
    Column("request_throughput", "req/s", "high"),
    Column("output_throughput", "output tok/s", "high"),
    Column("goodput", "goodput req/s", "high"),
    *(
        Column(f"{m}.{s}", f"{LATENCY_TITLES[m]} {s}", "low", "ms")
        for m in LATENCY_METRICS
        for s in ("p50", "p99")
    ),
    Column("error_rate", "errors", "low", "%"),
    Column("kv_usage.mean", "KV usage mean", None, "%"),
    Column("kv_usage.max", "KV usage max", None, "%"),
    Column("util_gpu.mean", "GPU util mean", None, "%"),
)


def _slo_seconds(meta: dict[str, Any]) -> dict[str, float]:
    slo = meta.get("slo")
    if not isinstance(slo, dict):
        cfg = meta.get("config")
        slo = cfg.get("slo") if isinstance(cfg, dict) else None
    if not isinstance(slo, dict):
        return {}
    out = {}
    for k, v in slo.items():
        if not isinstance(v, (int, float)):
            continue
        for suffix, scale in (("_ms", 1e-3), ("_s", 1.0)):
            if k.endswith(suffix) and k[: -len(suffix)] in ("ttft", "tpot", "e2e"):
                out[k[: -len(suffix)]] = float(v) * scale
    return out


def goodput(s: RunSamples, meta: dict[str, Any]) -> float | None:
    """Requests/s meeting every SLO in run.json (`slo` = {ttft_ms, tpot_ms, e2e_ms}); None if
    the run has no SLO and its summary gives no goodput."""
    slo = _slo_seconds(meta)
    if not slo:
        summary = meta.get("summary")
        g = summary.get("goodput") if isinstance(summary, dict) else None
        if isinstance(g, dict):
            g = g.get("requests_per_s", g.get("value"))
        return float(g) if isinstance(g, (int, float)) else None
    if s.window_s <= 0:
        return None
    good = np.ones(s.n_ok, dtype=bool)
    for metric, limit in slo.items():
        v = s.latency(metric)
        good &= np.nan_to_num(v, nan=0.0) <= limit  # undefined TPOT (1 token) meets the SLO
    return float(good.sum()) / s.window_s


def _series_stats(timeseries: list[dict], key: str, scale: float) -> dict[str, float | None]:
    vals = [float(x[key]) * scale for x in timeseries if isinstance(x.get(key), (int, float))]
    if not vals:
        return {"mean": None, "max": None}
    return {"mean": float(np.mean(vals)), "max": float(np.max(vals))}


def summary_row(lr: LoadedRun, s: RunSamples | None = None) -> dict[str, Any]:
    s = s or extract(lr.run)
    row: dict[str, Any] = {
        "requests": f"{s.n_ok}/{s.n_total}",
        "request_throughput": s.request_throughput,
        "output_throughput": s.output_throughput,
        "goodput": goodput(s, lr.meta),
        "error_rate": s.error_rate if s.n_total else None,
        "errors": s.n_errors,
    }
    for m in LATENCY_METRICS:
        for k, v in describe(x for x in s.latency(m) if not math.isnan(x)).items():
            row[f"{m}.{k}"] = v
    for k, v in _series_stats(lr.run.timeseries, "kv_usage", 1.0).items():
        row[f"kv_usage.{k}"] = v
    # NVML reports utilization in percent; shown as a fraction like KV usage.
    for k, v in _series_stats(lr.run.timeseries, "util_gpu", 0.01).items():
        row[f"util_gpu.{k}"] = v
    return row


def best_index(values: list[Any], better: str | None) -> set[int]:
    """Indices holding the best value (ties all marked); none with fewer than two values."""
    nums = [(i, v) for i, v in enumerate(values) if isinstance(v, (int, float))]
    if better is None or len(nums) < 2:
        return set()
    pick = max if better == "high" else min
    best = pick(v for _, v in nums)
    return {i for i, v in nums if v == best}


def fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "–"
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return str(value)
    if unit == "ms":
        return f"{value * 1e3:,.1f}"
    if unit == "%":
        return f"{value * 100:.1f}%"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.0f}"
