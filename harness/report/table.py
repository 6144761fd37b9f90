"""The summary table: one row per run, columns with a direction so the best value is marked."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from cbbench.harness.report.experts import expert_fields
from cbbench.harness.report.replicas import imbalance_fields
from cbbench.harness.report.runs import LoadedRun
from cbbench.harness.report.samples import LATENCY_METRICS, RunSamples, extract
from cbbench.harness.results.compare import kv_dtype_label, kv_pool, preemptions
from cbbench.harness.results.formats.imported import is_aggregate_only
from cbbench.harness.results.summary import SLO_KEYS, summarize

LATENCY_TITLES = {
    "ttft": "TTFT",
    "ttfo": "TTFO",
    "tpot": "TPOT",
    "itl": "ITL",
    "e2e": "E2E",
    "queue": "queue",
}
STAT_KEYS = ("mean", "p50", "p90", "p95", "p99", "max")


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    better: str | None  # "high", "low" or None (no best marked)
    unit: str = ""  # "ms" (value in seconds, shown in ms), "%" (fraction shown as %), ""
    optional: bool = False  # shown only when some run has a value


SUMMARY_COLUMNS: tuple[Column, ...] = (
    Column("requests", "requests ok", None),
    Column("request_throughput", "req/s", "high"),
    Column("output_throughput", "output tok/s", "high"),
    Column("goodput", "goodput req/s", "high"),
    *(
        # TTFO: shown when a run reasoned (else it is TTFT)
        Column(f"{m}.{s}", f"{LATENCY_TITLES[m]} {s}", "low", "ms", optional=m == "ttfo")
        for m in LATENCY_METRICS
        for s in ("p50", "p99")
    ),
    Column("reasoning_share", "reasoning share", None, "%", optional=True),
    Column("error_rate", "errors", "low", "%"),
    Column("kv_usage.mean", "KV usage mean", None, "%"),
    Column("kv_usage.max", "KV usage max", None, "%"),
    Column("util_gpu.mean", "GPU util mean", None, "%"),
    # the KV pool as the engine reported it (run.json), capacity = compare.seqs_held
    Column("kv_cache_dtype", "KV dtype", None, optional=True),
    Column("num_kv_blocks", "KV blocks", "high", optional=True),
    Column("kv_capacity", "capacity (seqs of mean len)", "high", optional=True),
    Column("running.max", "running peak", None, optional=True),
    Column("running.mean", "running mean", None, optional=True),
    Column("preemptions", "preemptions", "low", optional=True),
    # speculative decoding, when the server (or the simulator) exposes it
    Column("spec_acceptance_rate", "spec acceptance", "high", "%", optional=True),
    Column("spec_mean_accepted_length", "spec tokens/step", "high", optional=True),
    # energy (NVML, else powercap) and cost (--cost-per-hour), when the run has them
    Column("j_per_request", "J/request", "low", optional=True),
    Column("output_tokens_per_j", "output tok/J", "high", optional=True),
    Column("usd_per_1m_output_tokens", "$/1M output tok", "low", optional=True),
    Column("usd_per_request", "$/request", "low", optional=True),
    # behind a router: imbalance of time-averaged load across replicas
    Column("replica_load_max_over_mean", "replica load max/mean", "low", optional=True),
    Column("replica_load_cv", "replica load CV", "low", optional=True),
    # MoE servers that export per-expert load: the worst layer's max / mean tokens per expert
    Column("expert_load_max_over_mean", "expert load max/mean", "low", optional=True),
)


# the summary's server-side columns start here (the HTML report shows them in a second table)
SERVER_COLUMNS_FROM = "kv_usage.mean"


def shown_columns(rows: list[dict[str, Any]]) -> list[Column]:
    """SUMMARY_COLUMNS less the optional ones no run has a value for."""
    return [
        c for c in SUMMARY_COLUMNS if not c.optional or any(r.get(c.key) is not None for r in rows)
    ]


def spec_fields(meta: dict[str, Any]) -> dict[str, float | None]:
    """Acceptance rate and tokens per verify step of a run: from the server's telemetry
    summary (measured runs) or the simulator's summary."""
    summ = meta.get("summary") or {}
    server = (summ.get("telemetry") or {}).get("server") or {}
    sim = summ.get("sim") or {}
    return {
        k: server.get(k) if server.get(k) is not None else sim.get(k)
        for k in ("spec_acceptance_rate", "spec_mean_accepted_length")
    }


def slo_seconds(meta: dict[str, Any]) -> dict[str, float]:
    """Goodput SLOs of a run: bench's `load.slo_s` ({ttft, tpot, e2e} in seconds), or a
    top-level `slo` with `_s`/`_ms` keys."""
    load = meta.get("load")
    slo = load.get("slo_s") if isinstance(load, dict) else None
    if isinstance(slo, dict) and slo:
        return {k: float(v) for k, v in slo.items() if k in SLO_KEYS and _num(v)}
    slo = meta.get("slo")
    out: dict[str, float] = {}
    for k, v in (slo if isinstance(slo, dict) else {}).items():
        for suffix, scale in (("_ms", 1e-3), ("_s", 1.0)):
            if _num(v) and k.endswith(suffix) and k[: -len(suffix)] in SLO_KEYS:
                out[k[: -len(suffix)]] = float(v) * scale
    return out


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _series_stats(timeseries: list[dict], key: str, scale: float) -> dict[str, float | None]:
    vals = [float(x[key]) * scale for x in timeseries if isinstance(x.get(key), (int, float))]
    if not vals:
        return {"mean": None, "max": None}
    return {"mean": float(np.mean(vals)), "max": float(np.max(vals))}


def summary_row(lr: LoadedRun, s: RunSamples | None = None) -> dict[str, Any]:
    """The run's numbers via `summary.summarize` (the same as bench prints), over the same
    measured window the gate uses."""
    s = s or extract(lr.run)
    if is_aggregate_only(lr.meta):  # imported without per-request data: the tool's figures
        summ = lr.meta.get("summary") or {}
        counts = summ.get("counts") or {}
        n_ok, n_total = counts.get("completed", 0), counts.get("total", 0)
    else:
        summ = summarize(lr.run.records, s.window_s or None, slo_seconds(lr.meta) or None)
        n_ok, n_total = s.n_ok, s.n_total
    good = summ.get("goodput")
    row: dict[str, Any] = {
        "requests": f"{n_ok}/{n_total}",
        "request_throughput": summ["request_throughput"],
        "output_throughput": summ["output_throughput"],
        "goodput": good.get("requests_per_s") if isinstance(good, dict) else None,
        "error_rate": summ.get("error_rate") if n_total else None,
        "errors": n_total - n_ok,
    }
    reasoned = bool(summ.get("total_reasoning_tokens"))
    for m in LATENCY_METRICS:
        key = "server_queue_s" if m == "queue" else f"{m}_s"
        for k, v in (summ.get(key) or {}).items():
            row[f"{m}.{k}"] = v if m != "ttfo" or reasoned else None
    row["reasoning_share"] = summ.get("reasoning_share") if reasoned else None
    for k, v in _series_stats(lr.run.timeseries, "kv_usage", 1.0).items():
        row[f"kv_usage.{k}"] = v
    # NVML reports utilization in percent; shown as a fraction like KV usage.
    for k, v in _series_stats(lr.run.timeseries, "util_gpu", 0.01).items():
        row[f"util_gpu.{k}"] = v
    row.update(spec_fields(lr.meta))
    row.update(kv_fields(lr))
    row.update(efficiency_fields(lr.meta))
    row.update(imbalance_fields(lr.meta))
    row.update(expert_fields(lr.meta))
    return row


def efficiency_fields(meta: dict[str, Any]) -> dict[str, float | None]:
    """Energy and cost per request and per token, as the run's summary has them."""
    eff = (meta.get("summary") or {}).get("efficiency") or {}
    energy, cost = eff.get("energy") or {}, eff.get("cost") or {}
    return {
        "j_per_request": energy.get("j_per_request"),
        "output_tokens_per_j": energy.get("output_tokens_per_j"),
        "usd_per_1m_output_tokens": cost.get("usd_per_1m_output_tokens"),
        "usd_per_request": cost.get("usd_per_request"),
    }


def kv_fields(lr: LoadedRun) -> dict[str, Any]:
    """KV dtype, pool blocks, capacity at the run's mean request length (prompt + output),
    running sequences (from the timeseries) and preemptions of a run, where known."""
    recs = lr.run.records
    mean_len = sum(r.prompt_len + r.output_len for r in recs) / len(recs) if recs else None
    pool = kv_pool(lr.meta, mean_len) or {}
    running = _series_stats(lr.run.timeseries, "running", 1.0)
    return {
        "kv_cache_dtype": kv_dtype_label(pool),
        "num_kv_blocks": pool.get("num_kv_blocks"),
        "kv_capacity": pool.get("capacity"),
        "running.max": running["max"],
        "running.mean": running["mean"],
        "preemptions": preemptions(lr.meta.get("summary") or {}),
    }


def best_index(values: list[Any], better: str | None, shown: list[str] | None = None) -> set[int]:
    """The index of the one best value, as a set; empty when fewer than two values, when the
    best is tied, or when another value prints the same (`shown`: the cells as printed), a
    difference below the printed precision being no difference a reader can see."""
    nums = [(i, v) for i, v in enumerate(values) if isinstance(v, (int, float))]
    if better is None or len(nums) < 2:
        return set()
    pick = max if better == "high" else min
    best = pick(v for _, v in nums)
    winners = [i for i, v in nums if v == best]
    if len(winners) > 1:
        return set()
    if shown is not None and sum(shown[i] == shown[winners[0]] for i, _ in nums) > 1:
        return set()
    return set(winners)


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


def fmt_column(values: list[Any], unit: str = "") -> list[str]:
    """One column's cells with one number format: the decimals follow the column's largest
    magnitude (1 from 100 up, 2 from 1, else 3), so no column reads "2,047" beside "370.45"."""
    if unit in ("ms", "%") or not any(
        isinstance(v, float) and not isinstance(v, bool) for v in values
    ):
        return [fmt(v, unit) for v in values]
    finite = [abs(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    top = max(finite, default=0.0)
    digits = 1 if top >= 100 else 2 if top >= 1 else 3
    if finite and all(float(v).is_integer() for v in finite):
        digits = 0  # counts (a running peak of 8 read "8.00")
    return [
        f"{v:,.{digits}f}"
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        else fmt(v, unit)
        for v in values
    ]
