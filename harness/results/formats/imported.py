"""What every importer returns (`Imported`), and how it becomes a run folder.

Per-request sources become records: what the source does not say stays None (never
invented). Aggregate-only sources become run.json's `summary` in cbbench's shape (seconds,
`{mean, p50, p90, p95, p99, max, count}`), with `imported.aggregate_only` set, and an empty
`requests.jsonl`, so that `report` and `gate` read them like any run.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cbbench.harness.errors import CbbenchError
from cbbench.harness.results.integrity import RECORDS_KEY, record_counts
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.run_folder import REQUESTS_FILE, RunWriter
from cbbench.harness.results.summary import summarize

AGGREGATE_ONLY = "imported, aggregate only"
STAT_KEYS = ("mean", "p50", "p90", "p95", "p99", "max")
LATENCIES = ("ttft_s", "ttfo_s", "tpot_s", "itl_s", "e2e_s", "server_queue_s")


@dataclass
class Imported:
    tool: str  # "guidellm", "aiperf", "vllm-bench", "inference-perf", "llm-d-benchmark-report"
    version: str | None  # of the tool, when the file says
    records: list[RequestRecord] = field(default_factory=list)
    aggregate: dict | None = None  # summary in cbbench's shape, when there are no records
    definitions: list[str] = field(default_factory=list)  # where the tool's differ from ours
    printed: dict[str, float | None] = field(default_factory=dict)  # the tool's own headline
    duration_s: float | None = None  # the tool's measured window, when it gives one
    workload: dict = field(default_factory=dict)  # what the tool says it sent
    load: dict = field(default_factory=dict)
    target: dict = field(default_factory=dict)
    environment: dict = field(default_factory=dict)  # from the source (llm-d report scenario)
    started_at: str | None = None


def endpoint(name: str | None) -> str | None:
    """A tool's name for the API it called, as cbbench names it (`chat`, `completions`,
    `embeddings`), so comparability reads it; None when it is none of these."""
    text = str(name or "").lower()
    if "chat" in text:
        return "chat"
    if "embed" in text:
        return "embeddings"
    if text.rstrip("/").endswith("completions") or text in ("vllm", "openai", "sglang", "lmdeploy"):
        return "completions"
    return None


def empty_stats() -> dict:
    return {**dict.fromkeys(STAT_KEYS), "count": 0}


def aggregate_summary(
    *,
    total: int,
    failed: int,
    duration_s: float | None,
    latencies: dict[str, dict],
    request_throughput: float | None,
    output_throughput: float | None,
    total_token_throughput: float | None = None,
    total_input_tokens: int | None = None,
    total_output_tokens: int | None = None,
    extra: dict | None = None,
) -> dict:
    """The summary of an aggregate-only import: the keys report and gate read."""
    s: dict[str, Any] = {
        "aggregate_only": True,
        "duration_s": duration_s,
        "counts": {"total": total, "completed": total - failed, "failed": failed},
        "error_rate": failed / total if total else 0.0,
        "request_throughput": request_throughput,
        "output_throughput": output_throughput,
        "total_token_throughput": total_token_throughput,
        "total_input_tokens": total_input_tokens,
        "total_output_tokens": total_output_tokens,
        "goodput": None,
    }
    for key in (*LATENCIES, "reasoning_s", "answer_tpot_s", "client_queue_s", "send_lag_s"):
        s[key] = latencies.get(key) or empty_stats()
    s.update(extra or {})
    return s


def is_aggregate_only(meta: dict) -> bool:
    return bool((meta.get("imported") or {}).get("aggregate_only"))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_imported(imp: Imported, source: Path, fmt: str, out: Path, command: list[str]) -> dict:
    """Write the run folder; returns its run.json."""
    if (out / REQUESTS_FILE).exists():
        raise CbbenchError(f"{out}: already holds a run; choose another --out")
    if not imp.records and imp.aggregate is None:
        raise CbbenchError(f"{source}: no requests and no aggregate figures to import")
    aggregate_only = not imp.records
    summary = (
        imp.aggregate
        if aggregate_only
        else summarize(imp.records, imp.duration_s if imp.duration_s else None)
    )
    meta = {
        "name": out.name,
        "status": "complete",
        "command": command,
        "imported": {
            "tool": imp.tool,
            "version": imp.version,
            "format": fmt,
            "file": str(source.resolve()),
            "sha256": _sha256(source),
            "aggregate_only": aggregate_only,
            "note": AGGREGATE_ONLY if aggregate_only else "imported, per request",
            "definitions": imp.definitions,
            "printed": imp.printed,
            "imported_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        },
        "workload": imp.workload,
        "target": imp.target,
        "load": imp.load,
        "environment": imp.environment,
        "started_at": imp.started_at,
        "interrupted": False,
        "summary": summary,
        # what requests.jsonl holds (integrity.py): none for an aggregate-only import
        RECORDS_KEY: record_counts(imp.records),
    }
    writer = RunWriter(out)
    try:
        for r in imp.records:
            writer.add_record(r)
        writer.write_run(meta)
    finally:
        writer.close()
    return meta


def write_all(
    runs: list[Imported], source: Path, fmt: str, out: Path, command: list[str]
) -> list[tuple[Path, Imported]]:
    """One run: the folder `out`. Several (a guidellm sweep): `out/<i>-<level>` each, with a
    sweep.json index, so that `report` expands them like a sweep folder."""
    if not runs:
        raise CbbenchError(f"{source}: holds no benchmark to import")
    if len(runs) == 1:
        write_imported(runs[0], source, fmt, out, command)
        return [(out, runs[0])]
    written = []
    for i, imp in enumerate(runs):
        level = imp.load.get("concurrency") or imp.load.get("rate")
        folder = out / (f"{i}-{imp.load.get('mode')}-{level}" if level else str(i))
        write_imported(imp, source, fmt, folder, command)
        written.append((folder, imp))
    index = {"runs": [f.name for f, _ in written], "imported": str(source)}
    (out / "sweep.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return written


def finish_record(r: RequestRecord, itl: list[float] | None = None) -> RequestRecord:
    """Fill the derived times the way the client does, from what the source gave:
    first_token_s/end_s from sent_s + ttft/e2e, token times from the ITL gaps, TPOT as
    (E2E - TTFT) / (tokens - 1). Fields the source lacks stay None."""
    if r.sent_s is not None:
        if r.first_token_s is None and r.ttft_s is not None:
            r.first_token_s = r.sent_s + r.ttft_s
        if r.end_s is None and r.e2e_s is not None:
            r.end_s = r.sent_s + r.e2e_s
    if itl:
        r.itl_s = [float(x) for x in itl]
        if r.first_token_s is not None:
            t = r.first_token_s
            times = [t]
            for gap in r.itl_s:
                t += gap
                times.append(t)
            r.token_times_s = times
            r.last_token_s = times[-1]
    if r.last_token_s is None and r.end_s is not None and r.status == "ok":
        r.last_token_s = r.end_s
    n = r.output_tokens_server if r.output_tokens_server is not None else r.output_tokens_client
    if r.tpot_s is None and r.ttft_s is not None and r.e2e_s is not None and n and n > 1:
        r.tpot_s = (r.e2e_s - r.ttft_s) / (n - 1)
    return r
