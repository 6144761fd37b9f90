"""`vllm bench serve --save-result [--save-detailed]` JSON.

With `--save-detailed` the file holds one entry a request in parallel lists (`start_times`
on the client's perf_counter clock, `ttfts`, `itls`, `latencies` in seconds, `input_lens`,
`output_lens`, `errors`): those become records. Older files (`benchmarks/benchmark_serving.py`
before `vllm bench serve`, e.g. vLLM 0.8/0.9) save only `input_lens`, `output_lens`, `ttfts`,
`itls`, `generated_texts`, `errors`: no send times (left None: `--from-run` reconstructs them
only where the load determines them, harness/planning/send_times.py) and no `latencies` (the
E2E is then the first token plus the gaps between chunks: the last chunk's time). Without it, only the aggregates
(`mean_ttft_ms`, `median_ttft_ms`, `p99_ttft_ms`, ...) remain: an aggregate-only import.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from cbbench.harness.results.formats.imported import (
    endpoint,
    Imported,
    aggregate_summary,
    empty_stats,
    finish_record,
)
from cbbench.harness.results.records import RequestRecord

TOOL = "vllm-bench"
DEFINITIONS = [
    "vllm bench TTFT starts before the POST is handed to aiohttp, so it includes opening the "
    "connection (cbbench's starts when the request is written, connection set-up apart)",
    "vllm bench ITL is one gap per streamed chunk (a chunk of k tokens is one gap); cbbench "
    "spreads a chunk's tokens over its gap",
    "vllm bench counts output tokens from usage, else by re-tokenizing the text",
]
_METRICS = {"ttft": "ttft_s", "tpot": "tpot_s", "itl": "itl_s", "e2el": "e2e_s"}


def sniff(data: Any) -> bool:
    return (
        isinstance(data, dict)
        and "request_throughput" in data
        and ("mean_ttft_ms" in data or "ttfts" in data or "mean_e2el_ms" in data)
    )


def _aggregates(d: dict) -> dict[str, dict]:
    """mean_/median_/pNN_ ... _ms -> seconds stats per cbbench metric (pNN: whatever the run
    asked for with --metric-percentiles; the ones cbbench shows are kept)."""
    out: dict[str, dict] = {}
    for name, key in _METRICS.items():
        if f"mean_{name}_ms" not in d:
            continue
        s = empty_stats()
        s["mean"] = d.get(f"mean_{name}_ms")
        s["p50"] = d.get(f"median_{name}_ms")
        for k, v in d.items():
            m = re.fullmatch(rf"p(\d+(?:\.\d+)?)_{name}_ms", k)
            if m and f"p{m.group(1)}" in s:
                s[f"p{m.group(1)}"] = v
        s = {
            k: (v / 1e3 if isinstance(v, (int, float)) and k != "count" else v)
            for k, v in s.items()
        }
        s["count"] = d.get("completed")
        out[key] = s
    return out


def read(data: dict, path: Path | None = None) -> list[Imported]:
    completed, failed = int(data.get("completed") or 0), int(data.get("failed") or 0)
    printed = {
        "ttft_p50_s": (data.get("median_ttft_ms") or 0) / 1e3 if "median_ttft_ms" in data else None,
        "output_throughput": data.get("output_throughput"),
    }
    imp = Imported(
        tool=TOOL,
        version=data.get("vllm_version") or data.get("version"),
        definitions=list(DEFINITIONS),
        printed=printed,
        duration_s=data.get("duration"),
        workload={
            "source": {
                "num_prompts": data.get("num_prompts"),
                "tokenizer": data.get("tokenizer_id"),
            }
        },
        load={
            # --request-rate inf (the default): all at once, held by --max-concurrency
            "mode": "open" if isinstance(data.get("request_rate"), (int, float)) else "closed",
            "rate": data.get("request_rate") if data.get("request_rate") != "inf" else None,
            "burstiness": data.get("burstiness"),
            "concurrency": data.get("max_concurrency"),
        },
        target={
            "model": data.get("model_id"),
            "endpoint": endpoint(data.get("backend")),
            "tool_endpoint": data.get("backend"),
        },
        started_at=data.get("date"),
    )
    ttfts = data.get("ttfts") or []
    if ttfts:  # --save-detailed (start_times only from vLLM 0.10 or so on)
        imp.records = _records(data)
        if not (data.get("latencies") or data.get("e2els")):
            imp.definitions.append("the file has no latencies (an older vllm bench): E2E taken "
                                   "as TTFT + the gaps between chunks, to the last chunk")  # fmt: skip
    else:
        imp.aggregate = aggregate_summary(
            total=completed + failed,
            failed=failed,
            duration_s=data.get("duration"),
            latencies=_aggregates(data),
            request_throughput=data.get("request_throughput"),
            output_throughput=data.get("output_throughput"),
            total_token_throughput=data.get("total_token_throughput"),
            total_input_tokens=data.get("total_input_tokens"),
            total_output_tokens=data.get("total_output_tokens"),
        )
    return [imp]


def _records(d: dict) -> list[RequestRecord]:
    n = len(d["ttfts"])
    starts = d.get("start_times") or []
    if len(starts) != n:  # an older vLLM: when each request was sent is not in the file
        starts = [None] * n
    t0 = min((t for t in starts if t is not None), default=0.0)

    def col(name: str) -> list:
        v = d.get(name) or []
        return v if len(v) == n else [None] * n

    errors, ins, outs = col("errors"), col("input_lens"), col("output_lens")
    lat, itls, queued = col("latencies"), col("itls"), col("queue_times")
    if all(v is None for v in lat):  # older files: "e2els" in some, none in the oldest
        lat = col("e2els")
    recs = []
    for i in range(n):
        err = errors[i] or None
        r = RequestRecord(
            id=f"vllm-{i}",
            index=i,
            prompt_len=int(ins[i] or 0),
            output_len=int(outs[i] or 0),
            sent_s=None if starts[i] is None else starts[i] - t0,
            status="error" if err else "ok",
            error=err,
            error_kind="imported" if err else None,
            prompt_tokens_server=ins[i],
            output_tokens_server=outs[i] if not err else None,
            client_queue_s=queued[i],  # waiting for a --max-concurrency slot
        )
        if not err:
            r.ttft_s = d["ttfts"][i]
            r.e2e_s = lat[i]
            if r.e2e_s is None and r.ttft_s is not None and itls[i] is not None:
                r.e2e_s = r.ttft_s + sum(itls[i])  # to the last chunk
        elif r.sent_s is not None and lat[i]:
            r.end_s = r.sent_s + lat[i]
        recs.append(finish_record(r, itls[i] if not err else None))
    return recs
