"""AIPerf's exports: `profile_export.jsonl` (one record a request: `metadata` with
`request_start_ns` / `request_end_ns` on the wall clock, `metrics` each `{value, unit}`,
`error` when it failed) and `profile_export_aiperf.json` (the aggregates: each metric
`{unit, avg, p50, p90, p99, ...}`, the version, the config).

The JSONL becomes records (warmup-phase ones marked warmup); the version and what AIPerf
printed come from the aggregate file beside it when there is one. The aggregate file alone
is an aggregate-only import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cbbench.harness.results.formats.files import beside, parse
from cbbench.harness.results.formats.imported import (
    endpoint,
    Imported,
    aggregate_summary,
    empty_stats,
    finish_record,
)
from cbbench.harness.results.records import RequestRecord

TOOL = "aiperf"
FILES = ("profile_export.jsonl", "profile_export_aiperf.json")
DEFINITIONS = [
    "AIPerf TTFT starts at request_start_ns, before its HTTP client connects (connection "
    "set-up included); cbbench's starts when the request is written",
    "AIPerf ITL = (request latency - TTFT) / (output tokens - 1) per request; its "
    "inter_chunk_latency is one gap a streamed chunk (imported as the ITL gaps only where "
    "chunks and tokens agree one to one)",
    "AIPerf counts output tokens with the client's tokenizer (output_sequence_length); the "
    "server's usage count is kept beside it",
]
_START = ("request_start_ns", "timestamp_ns")  # the send time (timestamp_ns: AIPerf < 0.2)
_UNIT = {"ms": 1e-3, "ns": 1e-9, "us": 1e-6, "sec": 1.0, "s": 1.0}
_LATENCY = {
    "time_to_first_token": "ttft_s",
    "time_to_first_output_token": "ttfo_s",
    "inter_token_latency": "tpot_s",  # AIPerf's per-request ITL is cbbench's TPOT
    "request_latency": "e2e_s",
}


def sniff(data: Any) -> bool:
    if isinstance(data, list):
        first = data[0] if data else {}
        meta = first.get("metadata") if isinstance(first, dict) else None
        return isinstance(meta, dict) and any(k in meta for k in _START)
    return isinstance(data, dict) and "aiperf_version" in data


def _value(metrics: dict, name: str) -> Any:
    m = metrics.get(name)
    if not isinstance(m, dict):
        return None
    v = m.get("value")
    scale = _UNIT.get(str(m.get("unit")), 1.0)
    if isinstance(v, list):
        return [x * scale for x in v]
    return v * scale if isinstance(v, (int, float)) and not isinstance(v, bool) else v


def _record(row: dict, i: int, t0_ns: int) -> RequestRecord:
    meta, metrics = row.get("metadata") or {}, row.get("metrics") or {}
    err = row.get("error")
    start = next((meta[k] for k in _START if meta.get(k) is not None), None)
    end = meta.get("request_end_ns")
    out_client = _value(metrics, "output_sequence_length")
    out_server = _value(metrics, "usage_completion_tokens")
    isl = _value(metrics, "input_sequence_length")
    rec = RequestRecord(
        id=str(meta.get("x_request_id") or f"aiperf-{i}"),
        index=i,
        prompt_len=int(isl or 0),
        output_len=int(out_client or out_server or 0),
        sent_s=None if start is None else (start - t0_ns) / 1e9,
        end_s=None if end is None else (end - t0_ns) / 1e9,
        prompt_tokens_client=isl,
        prompt_tokens_server=_value(metrics, "usage_prompt_tokens"),
        output_tokens_client=out_client,
        output_tokens_server=out_server,
        status="error" if err else "ok",
        warmup=meta.get("benchmark_phase") == "warmup",
        session_id=meta.get("x_correlation_id") if meta.get("turn_index") else None,
    )
    if err:
        rec.error = str(err.get("message") or err) if isinstance(err, dict) else str(err)
        rec.error_kind = (
            f"http_{err['code']}" if isinstance(err, dict) and err.get("code") else "imported"
        )
        return finish_record(rec)
    rec.ttft_s = _value(metrics, "time_to_first_token")
    rec.ttfo_s = _value(metrics, "time_to_first_output_token")
    rec.e2e_s = _value(metrics, "request_latency")
    gaps = _value(metrics, "inter_chunk_latency")
    n = out_server if out_server is not None else out_client
    itl = gaps if isinstance(gaps, list) and n is not None and len(gaps) == n - 1 else None
    return finish_record(rec, itl)


def _aggregate_file(data: dict) -> dict:
    latencies = {}
    for name, key in _LATENCY.items():
        m = data.get(name)
        if isinstance(m, dict) and m.get("avg") is not None:
            f = _UNIT.get(str(m.get("unit")), 1.0)
            s = empty_stats()
            s.update(
                {
                    k: (m[k] * f if m.get(k) is not None else None)
                    for k in ("p50", "p90", "p95", "p99", "max")
                }
            )
            s["mean"], s["count"] = m["avg"] * f, m.get("count")
            latencies[key] = s
    return latencies


def _avg(data: dict, name: str) -> float | None:
    m = data.get(name)
    return m.get("avg") if isinstance(m, dict) else None


def _from_aggregate(agg: dict) -> Imported:
    total = int(_avg(agg, "request_count") or 0)
    done = _avg(agg, "completed_request_count")
    failed = total - int(done) if done is not None else len(agg.get("error_summary") or [])
    cfg = agg.get("input_config") or {}
    phases = cfg.get("phases") or [{}]
    ttft = agg.get("time_to_first_token") or {}
    imp = Imported(
        tool=TOOL,
        version=agg.get("aiperf_version"),
        definitions=list(DEFINITIONS),
        printed={
            "ttft_p50_s": ttft.get("p50") * _UNIT.get(ttft.get("unit"), 1.0)
            if ttft.get("p50") is not None
            else None,
            "output_throughput": _avg(agg, "output_token_throughput"),
        },
        duration_s=_avg(agg, "benchmark_duration"),
        workload={"source": {"aiperf_datasets": cfg.get("datasets")}},
        load={
            "mode": "closed" if phases[0].get("concurrency") else "open",
            "concurrency": phases[0].get("concurrency"),
            "rate": phases[0].get("rate"),
        },
        target={
            "base_url": ((cfg.get("endpoint") or {}).get("urls") or [None])[0],
            "model": (((cfg.get("models") or {}).get("items") or [{}])[0]).get("name"),
            "endpoint": endpoint((cfg.get("endpoint") or {}).get("type")),
            "tool_endpoint": (cfg.get("endpoint") or {}).get("type"),
        },
        started_at=agg.get("start_time"),
    )
    imp.aggregate = aggregate_summary(
        total=total,
        failed=max(0, failed),
        duration_s=imp.duration_s,
        latencies=_aggregate_file(agg),
        request_throughput=_avg(agg, "request_throughput"),
        output_throughput=_avg(agg, "output_token_throughput"),
        total_token_throughput=_avg(agg, "total_token_throughput"),
        total_output_tokens=_avg(agg, "total_output_tokens"),
    )
    return imp


def read(data: Any, path: Path | None = None) -> list[Imported]:
    agg = data if isinstance(data, dict) else None
    other = beside(path, FILES[1])
    if agg is None and other is not None:
        agg = parse(other)
    if isinstance(data, dict):
        return [_from_aggregate(data)]
    imp = (
        _from_aggregate(agg)
        if agg
        else Imported(tool=TOOL, version=None, definitions=list(DEFINITIONS))
    )
    imp.aggregate = None
    starts = [
        next((m[k] for k in _START if m.get(k) is not None), None)
        for m in (r.get("metadata") or {} for r in data)
    ]
    t0 = min((t for t in starts if t is not None), default=0)
    imp.records = [_record(r, i, t0) for i, r in enumerate(data)]
    imp.duration_s = None  # the records' own window (AIPerf's duration includes its start-up)
    return [imp]
