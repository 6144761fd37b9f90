"""guidellm's benchmarks report (`--output kind=json` / `kind=yaml`, benchmarks.json/.yaml).

One run per benchmark in the file (a sweep's rates are several). Each request in
`requests.successful / errored / incomplete` becomes a record: its start and end, TTFT,
first and last token times (`info.timings`), token counts. guidellm keeps no per-token
times, only each request's mean ITL: `itl_s` stays empty rather than invented. The file's
own statistics (`metrics.*.successful`) are kept as what guidellm printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cbbench.harness.results.formats.imported import Imported, endpoint, finish_record
from cbbench.harness.results.records import RequestRecord

TOOL = "guidellm"
DEFINITIONS = [
    "guidellm TPOT = request latency / output tokens (the first token's wait included); "
    "cbbench's TPOT = (E2E - TTFT) / (output tokens - 1)",
    "guidellm ITL = (last token - first token) / (output tokens - 1) per request, averaged "
    "over requests; cbbench's ITL pools every gap",
    "guidellm's request start is stamped before its HTTP client sends (connection set-up "
    "included); cbbench's TTFT starts when the request is written",
]


def sniff(data: Any) -> bool:
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        return False
    b = data["benchmarks"][0] if data["benchmarks"] else {}
    return isinstance(b, dict) and "requests" in b and "metrics" in b


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _record(r: dict, i: int, t0: float, status: str) -> RequestRecord:
    info = r.get("info") or {}
    timings = info.get("timings") or {}
    start = (
        _num(r.get("request_start_time"))
        or _num(timings.get("request_start"))
        or _num(r.get("start_time"))
    )
    end = (
        _num(r.get("request_end_time"))
        or _num(timings.get("request_end"))
        or _num(r.get("end_time"))
    )
    first = _num(timings.get("first_token_iteration")) or _num(r.get("first_token_time"))
    last = _num(timings.get("last_token_iteration")) or _num(r.get("last_token_time"))
    prompt, out = r.get("prompt_tokens"), r.get("output_tokens")
    rec = RequestRecord(
        id=str(r.get("request_id") or f"guidellm-{i}"),
        index=i,
        prompt_len=int(prompt or 0),
        output_len=int(out or 0),
        sent_s=None if start is None else start - t0,
        end_s=None if end is None else end - t0,
        first_token_s=None if first is None else first - t0,
        last_token_s=None if last is None else last - t0,
        prompt_tokens_server=prompt,
        output_tokens_server=out,
        status="ok" if status == "successful" else "error",
    )
    if status == "successful":
        ttft = _num(r.get("time_to_first_token_ms"))
        rec.ttft_s = ttft / 1e3 if ttft is not None else None
        rec.e2e_s = _num(r.get("request_latency"))
    else:
        err = info.get("error") or r.get("error") or status
        rec.error, rec.error_kind = str(err), "imported" if status == "errored" else "incomplete"
    return finish_record(rec)


def _benchmark(b: dict, version: str | None) -> Imported:
    t0 = _num(b.get("start_time")) or 0.0
    cfg = b.get("config") or {}
    strategy = cfg.get("strategy") or {}
    m = b.get("metrics") or {}

    def printed(key: str, scale: float = 1.0) -> float | None:
        v = ((m.get(key) or {}).get("successful") or {}).get("median")
        return None if v is None else float(v) * scale

    imp = Imported(
        tool=TOOL,
        version=version,
        definitions=list(DEFINITIONS),
        printed={
            "ttft_p50_s": printed("time_to_first_token_ms", 1e-3),
            "output_throughput": (
                (m.get("output_tokens_per_second") or {}).get("successful") or {}
            ).get("mean"),
        },
        duration_s=_num(b.get("duration")),
        workload={"source": {"guidellm_strategy": strategy}},
        load={
            "mode": "closed" if strategy.get("type_") in ("concurrent", "synchronous") else "open",
            "concurrency": strategy.get("streams") or strategy.get("max_concurrency"),
            "rate": strategy.get("rate"),
        },
        target={
            "base_url": (cfg.get("backend") or {}).get("target"),
            "model": (cfg.get("backend") or {}).get("model"),
            "endpoint": endpoint((cfg.get("backend") or {}).get("request_format")),
            "tool_endpoint": (cfg.get("backend") or {}).get("request_format"),
        },
    )
    reqs = b.get("requests") or {}
    i = 0
    for status in ("successful", "errored", "incomplete"):
        for r in reqs.get(status) or []:
            imp.records.append(_record(r, i, t0, status))
            i += 1
    made = (m.get("request_totals") or {}).get("total")
    if isinstance(made, int) and made > len(imp.records):  # guidellm's --sample-size
        imp.definitions.append(
            f"the file keeps {len(imp.records)} of guidellm's {made} requests (its sample): "
            "distributions are the sample's, and throughput counts only the sampled requests"
        )
    return imp


def read(data: dict, path: Path | None = None) -> list[Imported]:
    version = (data.get("metadata") or {}).get("guidellm_version")
    return [_benchmark(b, version) for b in data["benchmarks"]]
