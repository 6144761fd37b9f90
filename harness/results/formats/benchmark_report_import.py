"""Importing an llm-d benchmark report v0.2.x (JSON or YAML): its aggregate request
performance becomes an aggregate-only run (`benchmark_report` writes one); cbbench's own
extras under `results.observability.metadata.cbbench` come back too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cbbench.harness.results.formats.benchmark_report import LATENCY_FIELDS
from cbbench.harness.results.formats.imported import Imported, aggregate_summary, empty_stats

TOOL = "llm-d-benchmark-report"


def sniff(data: Any) -> bool:
    return (
        isinstance(data, dict)
        and isinstance(data.get("results"), dict)
        and isinstance(data.get("run"), dict)
        and str(data.get("version", "")).startswith("0.2")
    )


def _back(stat: dict | None, scale: float = 1.0) -> dict:
    """Statistics -> cbbench stats (seconds): the tool's units converted."""
    if not isinstance(stat, dict) or stat.get("mean") is None:
        return empty_stats()
    units = stat.get("units")
    f = scale * (1e-3 if units in ("ms", "ms/token") else 1.0)
    out = {
        k: (stat[k] * f if isinstance(stat.get(k), (int, float)) else None)
        for k in ("mean", "p50", "p90", "p95", "p99", "max")
    }
    out["count"] = None
    return out


def _definitions(tool: str, version: str | None, cb: dict) -> list[str]:
    """A report cbbench wrote keeps cbbench's definitions (and those of a run it imported)."""
    if tool == "cbbench":
        out = []
    elif tool == "unknown":
        out = ["figures as the producing tool defined them (the report does not name it)"]
    else:
        out = [f"figures as {tool} {version or ''} defined them (scenario.load names it)"]
    return out + list((cb.get("imported") or {}).get("definitions") or [])


def read(data: dict, path: Path | None = None) -> list[Imported]:
    agg = ((data.get("results") or {}).get("request_performance") or {}).get("aggregate") or {}
    req, lat, thr = agg.get("requests") or {}, agg.get("latency") or {}, agg.get("throughput") or {}
    scen = data.get("scenario") or {}
    load = (scen.get("load") or {}).get("standardized") or {}
    extras = ((data.get("results") or {}).get("observability") or {}).get("metadata") or {}
    cb = extras.get("cbbench") or {}
    latencies = {k: _back(lat.get(f)) for f, (k, _) in LATENCY_FIELDS.items()}
    for key in ("ttfo_s", "server_queue_s"):
        if isinstance(cb.get(key), dict):
            latencies[key] = cb[key]
    total, failed = int(req.get("total") or 0), int(req.get("failures") or 0)
    ok = total - failed
    for v in latencies.values():
        if v.get("count") is None:
            v["count"] = ok if v.get("mean") is not None else 0

    def mean(k: str) -> float | None:
        return (thr.get(k) or {}).get("mean")

    rps = mean("request_rate")
    dur = ok / rps if rps else None
    tin = mean("input_token_rate")
    tool = load.get("tool") or "unknown"
    imp = Imported(
        tool=TOOL,
        version=str(data.get("version")),
        definitions=_definitions(tool, load.get("tool_version"), cb),
        printed={
            "ttft_p50_s": latencies["ttft_s"].get("p50"),
            "output_throughput": mean("output_token_rate"),
        },
        duration_s=dur,
        workload={
            "source": {"producer": tool, "description": (scen.get("load") or {}).get("metadata")}
        },
        load={k: load.get(k) for k in ("rate_qps", "concurrency") if load.get(k) is not None},
        environment={"benchmark_report_scenario": scen} if scen else {},
        started_at=((data.get("run") or {}).get("time") or {}).get("start"),
    )
    if isinstance(cb.get("environment"), dict):
        imp.environment = {**cb["environment"], **imp.environment}
    imp.aggregate = aggregate_summary(
        total=total,
        failed=failed,
        duration_s=dur,
        latencies=latencies,
        request_throughput=rps,
        output_throughput=mean("output_token_rate"),
        total_token_throughput=mean("total_token_rate"),
        total_input_tokens=int(round(tin * dur)) if tin is not None and dur else None,
        extra={"producer": {"tool": tool, "version": load.get("tool_version")}},
    )
    return [imp]
