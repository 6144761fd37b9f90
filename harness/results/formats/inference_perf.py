"""inference-perf's request-lifecycle reports: `per_request_lifecycle_metrics.json`
(`report.request_lifecycle.per_request: true`; one entry a request: `start_time`,
`end_time` and every output token's arrival on the client's monotonic clock, token counts,
`error`) and `summary_lifecycle_metrics.json` (the aggregates, seconds).

Per-request data become records with every token's time; the summary alone is an
aggregate-only import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cbbench.harness.results.formats.files import beside, parse
from cbbench.harness.results.formats.imported import Imported, aggregate_summary, empty_stats
from cbbench.harness.results.records import RequestRecord

TOOL = "inference-perf"
FILES = ("per_request_lifecycle_metrics.json", "summary_lifecycle_metrics.json")
DEFINITIONS = [
    "inference-perf TTFT starts before its HTTP client sends (connection set-up included); "
    "cbbench's starts when the request is written",
    "inference-perf counts output tokens by re-tokenizing the response unless "
    "use_server_output_tokens is set; cbbench prefers the server's usage count",
]
_LATENCY = {
    "time_to_first_token": "ttft_s",
    "time_per_output_token": "tpot_s",
    "inter_token_latency": "itl_s",
    "request_latency": "e2e_s",
}


def sniff(data: Any) -> bool:
    if isinstance(data, list):
        first = data[0] if data else {}
        return isinstance(first, dict) and {"start_time", "end_time", "info"} <= set(first)
    return isinstance(data, dict) and "successes" in data and "benchmark_time_seconds" in data


def _record(r: dict, i: int, t0: float) -> RequestRecord:
    info = r.get("info") or {}
    resp = info.get("response_metrics") or {}
    usage = resp.get("server_usage") or {}
    times = [float(t) - t0 for t in resp.get("output_token_times") or []]
    err = r.get("error")
    prompt = info.get("input_tokens")
    rec = RequestRecord(
        id=f"inference-perf-{i}",
        index=i,
        prompt_len=int(prompt or 0),
        output_len=int(resp.get("output_tokens") or 0),
        sent_s=float(r["start_time"]) - t0,
        end_s=float(r["end_time"]) - t0,
        prompt_tokens_client=prompt,
        prompt_tokens_server=usage.get("prompt_tokens"),
        output_tokens_client=resp.get("output_tokens"),
        output_tokens_server=usage.get("completion_tokens"),
        status="error" if err else "ok",
    )
    if err:
        if isinstance(err, dict):  # inference-perf: {error_type, error_msg}
            rec.error = str(err.get("error_msg") or err.get("message") or err)
            rec.error_kind = str(err.get("error_type") or "imported")
        else:
            rec.error, rec.error_kind = str(err), "imported"
        return rec
    rec.e2e_s = rec.end_s - rec.sent_s
    if times:
        rec.token_times_s = times
        rec.first_token_s, rec.last_token_s = times[0], times[-1]
        rec.ttft_s = times[0] - rec.sent_s
        rec.itl_s = [b - a for a, b in zip(times, times[1:])]
        n = rec.output_tokens_server if rec.output_tokens_server is not None else len(times)
        if n and n > 1:
            rec.tpot_s = (rec.e2e_s - rec.ttft_s) / (n - 1)
    return rec


def _stats(d: dict | None) -> dict:
    if not isinstance(d, dict) or d.get("mean") is None:
        return empty_stats()
    s = empty_stats()
    s.update({k: d.get(k) for k in ("mean", "p90", "p95", "p99", "max")})
    s["p50"] = d.get("median")
    return s


def _from_summary(s: dict) -> Imported:
    ok, bad = s.get("successes") or {}, s.get("failures") or {}
    lat, thr = ok.get("latency") or {}, ok.get("throughput") or {}
    latencies = {key: _stats(lat.get(name)) for name, key in _LATENCY.items()}
    for v in latencies.values():
        v["count"] = ok.get("count") if v["mean"] is not None else 0
    imp = Imported(
        tool=TOOL,
        version=None,
        definitions=list(DEFINITIONS),
        printed={
            "ttft_p50_s": latencies["ttft_s"]["p50"],
            "output_throughput": thr.get("output_tokens_per_sec"),
        },
        duration_s=s.get("benchmark_time_seconds"),
    )
    total = int(ok.get("count") or 0) + int(bad.get("count") or 0)
    imp.aggregate = aggregate_summary(
        total=total,
        failed=int(bad.get("count") or 0),
        duration_s=imp.duration_s,
        latencies=latencies,
        request_throughput=thr.get("requests_per_sec"),
        output_throughput=thr.get("output_tokens_per_sec"),
        total_token_throughput=thr.get("total_tokens_per_sec"),
        total_input_tokens=(ok.get("prompt_tokens") or {}).get("total"),
        total_output_tokens=(ok.get("output_tokens") or {}).get("total"),
    )
    return imp


def read(data: Any, path: Path | None = None) -> list[Imported]:
    if isinstance(data, dict):
        return [_from_summary(data)]
    other = beside(path, FILES[1])
    summary = parse(other) if other is not None else None
    imp = (
        _from_summary(summary)
        if summary
        else Imported(tool=TOOL, version=None, definitions=list(DEFINITIONS))
    )
    imp.aggregate, imp.duration_s = None, None
    t0 = min(float(r["start_time"]) for r in data)
    imp.records = [_record(r, i, t0) for i, r in enumerate(data)]
    return [imp]
