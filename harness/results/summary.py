"""Records -> summary dict: a pure function, shared by bench, report, gate and locust.

Latency statistics cover successful, non-warmup requests only; failures are counted by kind
and reason, never mixed into percentiles. Vectorised with numpy (1M records in seconds).
"""

from __future__ import annotations

import itertools
import operator
import re
from collections import Counter
from collections.abc import Sequence
from typing import TypedDict

import numpy as np
from cbbench.harness.results.phases import phase_summary
from cbbench.harness.results.client_timing import client_bound_reasons, worker_timing
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.slo import (  # noqa: F401 - re-exported: commands import them here
    SLO_GRAMMAR,
    SLO_HELP,
    SLO_KEYS,
    SLO_STATS,
    parse_duration,
    parse_slo,
    slo_key,
)
from cbbench.harness.results.session_summary import session_summary
from cbbench.harness.results.time_split import time_split
from cbbench.workloads.stats import describe_array


class Stats(TypedDict):
    """One metric's statistics (workloads/stats.describe): None when nothing was measured."""

    mean: float | None
    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    max: float | None
    count: int


class Counts(TypedDict, total=False):
    total: int  # measured (non-warmup) requests
    completed: int
    failed: int
    warmup_excluded: int
    short_outputs: int
    prompt_token_mismatch: int
    output_token_mismatch: int
    token_count_mismatch: int


class RunSummary(TypedDict, total=False):
    """The one run summary (run.json's "summary"): bench, locust, run and sim write it, report,
    gate and diagnose read it. A replay adds its engine step statistics under "sim"
    (studies.simulation.run_summary); a run with telemetry adds "telemetry"."""

    duration_s: float
    counts: Counts
    error_rate: float
    errors_by_kind: dict[str, int]
    errors_by_reason: dict[str, int]
    ttft_s: Stats
    ttfo_s: Stats  # first answer token (reasoning excluded)
    reasoning_s: Stats  # ttfo - ttft
    answer_tpot_s: Stats
    tpot_s: Stats
    itl_s: Stats
    e2e_s: Stats
    client_queue_s: Stats
    server_queue_s: Stats
    send_lag_s: Stats
    request_throughput: float | None
    output_throughput: float | None
    total_token_throughput: float | None
    total_output_tokens: int
    total_input_tokens: int
    total_reasoning_tokens: int
    reasoning_share: float | None  # reasoning tokens / output tokens (records that say both)
    stream_flags: dict[str, int]  # flag -> records the stream classifier flagged
    prompt_token_mismatch_mean: float | None
    goodput: dict | None
    client: dict
    client_bound: bool
    client_bound_reason: str | None
    sessions: dict
    phases: dict  # P/D servers: prefill queue, prefill, transfer, decode queue, decode
    server_timing: dict  # where the time went (results/time_split.py), from the server's times
    sim: dict  # a replay's step statistics (SimResult.summary())
    embedding_inputs: int  # --endpoint embeddings: inputs embedded (requests x batch)
    embedding_input_throughput: float | None  # inputs/s
    # written by the runner (harness/load/runner.py) for runs over HTTP
    telemetry: dict  # the samplers' summaries
    efficiency: dict  # energy and cost per request and per token (results/efficiency.py)
    cancelled_in_flight: int
    connections: dict
    timestamp_source: str
    server_stopped_answering: str
    stopped_early: str  # the first requests all failed with one client error (outcome.py)
    worker_crashes: list


_COLUMNS = (
    "sent_s",
    "end_s",
    "last_token_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "ttfo_s",
    "reasoning_s",
    "answer_tpot_s",
    "reasoning_tokens",
    "output_tokens_server",
    "output_tokens_client",
    "prompt_tokens_server",
    "prompt_tokens_client",
    "prompt_len",
    "output_len",
    "client_queue_s",
    "server_queue_s",
    "send_lag_s",
    "scheduled_s",
)
_ROW = operator.attrgetter(*_COLUMNS)


def _table(records: Sequence[RequestRecord]) -> dict[str, np.ndarray]:
    """The numeric fields as float columns (None -> NaN), in one pass over the records."""
    if not records:
        return {c: np.empty(0) for c in _COLUMNS}
    t = np.array([_ROW(r) for r in records], dtype=np.float64)
    return {c: t[:, i] for i, c in enumerate(_COLUMNS)}


def _window(m: dict[str, np.ndarray]) -> float:
    starts, ends = m["sent_s"], _first(m["end_s"], m["last_token_s"])
    valid = starts.size and not np.all(np.isnan(starts)) and not np.all(np.isnan(ends))
    return float(np.nanmax(ends) - min(0.0, np.nanmin(starts))) if valid else 0.0


def measured_window_s(measured: Sequence[RequestRecord]) -> float:
    """A run's measured duration when run.json does not say: from t0 (or an earlier send) to
    the last response of the measured (non-warmup) records. The rule `summarize` uses."""
    return _window(_table(measured))


def output_tokens(r: RequestRecord) -> int:
    """Output tokens of one record as `summarize` counts them: the server's count, else the
    client's, else 0."""
    for n in (r.output_tokens_server, r.output_tokens_client):
        if n is not None:
            return int(n)
    return 0


def _first(*cols: np.ndarray) -> np.ndarray:
    out = cols[0].copy()
    for c in cols[1:]:
        out = np.where(np.isnan(out), c, out)
    return out


def summarize(
    records: Sequence[RequestRecord],
    duration_s: float | None = None,
    slo: dict[str, float] | None = None,
    client: dict | None = None,
) -> RunSummary:
    """Summary of a run. `client`: optional {"loop_lag_s": [...], "cpu": [...]} samples and
    `timestamp_source` ("kernel" | "user", default user: the stricter loop-lag limit)."""
    measured = [r for r in records if not r.warmup]
    is_ok = np.array([r.status == "ok" for r in measured], dtype=bool)
    failed = [r for r in measured if r.status != "ok"]
    m = _table(measured)
    ok = {c: v[is_ok] for c, v in m.items()}
    n_ok = int(is_ok.sum())
    if duration_s is None:
        duration_s = _window(m)

    ttft, tpot, e2e = ok["ttft_s"], ok["tpot_s"], ok["e2e_s"]
    ok_recs = [r for r, good in zip(measured, is_ok, strict=True) if good]
    n_itl = sum(len(r.itl_s) for r in ok_recs)
    itl = np.fromiter(itertools.chain.from_iterable(r.itl_s for r in ok_recs), np.float64, n_itl)
    out_tokens = np.nan_to_num(_first(ok["output_tokens_server"], ok["output_tokens_client"]))
    in_tokens = _first(ok["prompt_tokens_server"], ok["prompt_tokens_client"], ok["prompt_len"])
    asked = ok["output_len"]
    p_client, p_server = m["prompt_tokens_client"], m["prompt_tokens_server"]
    mismatch = ~np.isnan(p_client) & ~np.isnan(p_server) & (p_client != p_server)
    o_client, o_server = ok["output_tokens_client"], ok["output_tokens_server"]
    out_mismatch = ~np.isnan(o_client) & ~np.isnan(o_server) & (o_client != o_server)

    dur = duration_s if duration_s > 0 else float("nan")
    summary: RunSummary = {
        "duration_s": duration_s,
        "counts": {
            "total": len(measured),
            "completed": n_ok,
            "failed": len(failed),
            "warmup_excluded": len(records) - len(measured),
            "short_outputs": int(np.sum(out_tokens < asked)),
            "prompt_token_mismatch": int(mismatch.sum()),
            "output_token_mismatch": int(out_mismatch.sum()),
            "token_count_mismatch": sum(1 for r in ok_recs if r.token_mismatch),
        },
        "error_rate": len(failed) / len(measured) if measured else 0.0,
        "errors_by_kind": dict(Counter(r.error_kind or "unknown" for r in failed)),
        "errors_by_reason": errors_by_reason(failed),
        "ttft_s": describe_array(ttft),
        "ttfo_s": describe_array(ok["ttfo_s"]),
        "reasoning_s": describe_array(ok["reasoning_s"]),
        "answer_tpot_s": describe_array(ok["answer_tpot_s"]),
        "tpot_s": describe_array(tpot),
        "itl_s": describe_array(itl),
        "e2e_s": describe_array(e2e),
        "client_queue_s": describe_array(m["client_queue_s"]),
        "server_queue_s": describe_array(ok["server_queue_s"]),
        "send_lag_s": describe_array(m["send_lag_s"]),
        "request_throughput": _rate(n_ok, dur),
        "output_throughput": _rate(float(out_tokens.sum()), dur),
        "total_token_throughput": _rate(float(out_tokens.sum() + in_tokens.sum()), dur),
        "total_output_tokens": int(out_tokens.sum()),
        "total_input_tokens": int(in_tokens.sum()),
        "total_reasoning_tokens": int(np.nansum(ok["reasoning_tokens"])),
        "reasoning_share": _share(ok["reasoning_tokens"], out_tokens),
        "stream_flags": dict(Counter(f for r in measured for f in r.stream_flags)),
        "prompt_token_mismatch_mean": (
            float(np.mean(p_server[mismatch] - p_client[mismatch])) if mismatch.any() else None
        ),
    }
    ttfo = ok["ttfo_s"]
    summary["goodput"] = _goodput(slo, ttft, tpot, e2e, len(measured), dur, ttfo) if slo else None
    client_stats = {
        "loop_lag_s": describe_array(np.asarray((client or {}).get("loop_lag_s", []), float)),
        "cpu": describe_array(np.asarray((client or {}).get("cpu", []), float)),
    }
    if (client or {}).get("workers"):
        client_stats.update(worker_timing(measured, client["workers"]))
    summary["client"] = client_stats
    inputs = sum(r.extra.get("inputs", 0) for r in ok_recs)  # embeddings: inputs per request
    summary["embedding_inputs"] = inputs
    summary["embedding_input_throughput"] = _rate(float(inputs), dur) if inputs else None
    open_loop_lag = m["send_lag_s"][~np.isnan(m["scheduled_s"])]  # scheduled sends only
    stamps = (client or {}).get("timestamp_source", "user")
    loop_lag = np.asarray((client or {}).get("loop_lag_s", []), float)
    reasons = client_bound_reasons(open_loop_lag, loop_lag, client_stats, stamps)
    summary["client_bound"] = bool(reasons)
    summary["client_bound_reason"] = "; ".join(reasons) or None
    split = time_split(ok_recs)
    if split is not None:
        summary["server_timing"] = split
    sessions = session_summary(records)
    if sessions is not None:
        summary["sessions"] = sessions
    phases = phase_summary(ok_recs)  # a disaggregated server's per-phase times
    if phases is not None:
        summary["phases"] = phases
    return summary


def _rate(x: float, dur: float) -> float | None:
    return None if np.isnan(dur) else x / dur


_UUID = re.compile(r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")
# an id: a run of letters, digits, '_' or '-' with a digit in it, 8 or more long
# (req_8f3a2b9c, chatcmpl-3f2a91d0, 0x7f3a...), or a long hex run
_ID = re.compile(r"\b(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[\w-]{8,}\b|\b[0-9a-fA-F]{12,}\b")


def reason_key(msg: str | None) -> str:
    """The grouping key of an error message: request ids and UUIDs made ID, numbers (ports,
    lengths, times; not an HTTP status) made N, so 35 identical 429s with 35 request ids are one group."""
    text = _UUID.sub("ID", msg or "unknown")
    text = _ID.sub("ID", text)
    return re.sub(r"(?<!HTTP )\d+(\.\d+)?", "N", text)[:120]  # a status stays itself


def errors_by_reason(failed: Sequence[RequestRecord], top: int = 10) -> dict[str, int]:
    """The `top` reasons, most frequent first: messages grouped by `reason_key`, each group
    shown by its first real message, verbatim (up to 300 characters), and its count."""
    counts: Counter = Counter()
    example: dict[str, str] = {}
    for r in failed:
        key = reason_key(r.error)
        counts[key] += 1
        example.setdefault(key, (r.error or "unknown")[:300])
    return {example[k]: n for k, n in counts.most_common(top)}


def _share(reasoning: np.ndarray, out: np.ndarray) -> float | None:
    """Reasoning tokens over output tokens, of the records that say how many they reasoned."""
    known = ~np.isnan(reasoning)
    total = float(out[known].sum())
    return float(reasoning[known].sum()) / total if known.any() and total > 0 else None


def meets_slo(r: RequestRecord, slo: dict[str, float]) -> bool:
    """Whether one finished request counts toward goodput: `_goodput`'s rule, per record (a
    failure misses; an undefined TPOT does not; a stream that never answered misses TTFO)."""
    if r.status != "ok":
        return False
    for key, bound in slo.items():
        v = getattr(r, f"{key}_s", None)
        if key == "ttfo" and v is None and r.ttft_s is not None:
            return False
        if v is not None and not v <= bound:
            return False
    return True


def _goodput(slo, ttft, tpot, e2e, n_measured: int, dur: float, ttfo=None) -> dict:
    good = np.ones(len(ttft), dtype=bool)
    for key, arr in (("ttft", ttft), ("ttfo", ttfo), ("tpot", tpot), ("e2e", e2e)):
        if key in slo and key == "ttfo" and arr is not None:  # a stream that never answered
            good &= np.isnan(ttft) | (arr <= slo[key])  # fails it (NaN <= x is False)
        elif key in slo:  # an undefined metric (e.g. TPOT of a 1-token output) does not fail it
            good &= np.isnan(arr) | (arr <= slo[key])
    n = int(good.sum())
    return {
        "slo_s": dict(slo),
        "requests": n,
        "requests_per_s": _rate(n, dur),
        "fraction": n / n_measured if n_measured else None,
    }
