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
from cbbench.harness.errors import CbbenchError
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.session_summary import session_summary
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
    sim: dict  # a replay's step statistics (SimResult.summary())
    embedding_inputs: int  # --endpoint embeddings: inputs embedded (requests x batch)
    embedding_input_throughput: float | None  # inputs/s
    # written by the runner (harness/load/runner.py) for runs over HTTP
    telemetry: dict  # the samplers' summaries
    cancelled_in_flight: int
    connections: dict
    timestamp_source: str
    server_stopped_answering: str
    worker_crashes: list


SLO_KEYS = ("ttft", "ttfo", "tpot", "e2e")
# The client set the pace when any of these is exceeded (seconds, or a fraction of one core).
SEND_LAG_P50_LIMIT_S = 0.002
SEND_LAG_P99_LIMIT_S = 0.010
LOOP_LAG_P99_LIMIT_S = 0.020  # kernel arrival stamps: loop lag delays reads, not their times
# user-space stamps: a read's time is when the loop got to it, so loop lag is timing error;
# flag it before that error passes 5 ms
LOOP_LAG_P99_LIMIT_USER_S = 0.005
CPU_LIMIT = 0.90
# the report flags a run where a worker's bound on its p99 timing error exceeds this
TIMING_BOUND_LIMIT_S = 0.001

_UNITS = {"ms": 1e-3, "us": 1e-6, "s": 1.0, "m": 60.0, "": 1.0}


def parse_duration(text: str, what: str) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(ms|us|s|m)?\s*", text)
    if not m:
        raise CbbenchError(f"{what}: {text!r} is not a duration (e.g. 200ms, 1.5s)")
    return float(m.group(1)) * _UNITS[m.group(2) or ""]


def parse_slo(text: str | None) -> dict[str, float]:
    """'ttft=200ms,tpot=50ms,e2e=10s' -> {'ttft': 0.2, 'tpot': 0.05, 'e2e': 10.0} (seconds);
    `ttfo` (first answer token) as `ttft`."""
    if not text:
        return {}
    out: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in SLO_KEYS:
            raise CbbenchError(f"--slo: {part!r}: expected one of {', '.join(SLO_KEYS)}=DURATION")
        out[key] = parse_duration(value, f"--slo {key}")
    return out


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
        "errors_by_reason": dict(Counter(_reason(r.error) for r in failed).most_common(10)),
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
    reasons = _client_bound_reasons(describe_array(open_loop_lag), client_stats, stamps)
    summary["client_bound"] = bool(reasons)
    summary["client_bound_reason"] = "; ".join(reasons) or None
    sessions = session_summary(records)
    if sessions is not None:
        summary["sessions"] = sessions
    return summary


def _rate(x: float, dur: float) -> float | None:
    return None if np.isnan(dur) else x / dur


def _reason(msg: str | None) -> str:
    return re.sub(r"\d+(\.\d+)?", "N", msg or "unknown")[:120]


def _share(reasoning: np.ndarray, out: np.ndarray) -> float | None:
    """Reasoning tokens over output tokens, of the records that say how many they reasoned."""
    known = ~np.isnan(reasoning)
    total = float(out[known].sum())
    return float(reasoning[known].sum()) / total if known.any() and total > 0 else None


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


def worker_timing(measured: Sequence[RequestRecord], workers: dict) -> dict:
    """Per worker (`workers`: id -> {"loop_lag_s": [...], "timestamp_source", "send_window_s":
    Stats, "cpu": [...]}): loop lag, send lag, send window and a bound on the p99 error of its
    stamps, the sum of two terms (docs/timing.md "Per-worker timing bound"):
    - send: the send window p99, `sent_s` stamped -> the write returned (on loopback the
      request is in the server's kernel by then; a GIL switch or a preemption there is error);
    - receive: how late the loop reads, the larger of its timer's lag p99 (`loop_lag_s`, 10
      samples a second) and, with kernel stamps, the p99 of each read's own wait (`read_delay_s`:
      the loop's read - the kernel's stamp). User-space stamps: a read is stamped when the
      loop gets to it, so that lateness is its error. Kernel stamps: the read keeps the
      kernel's time however late the loop is, except that TCP merges segments a late read
      finds together and keeps the last one's time: error up to that lateness, possible only
      when it exceeds the gap between tokens (ITL p50 of the worker's records), else 0."""
    by_worker: dict[int, list[RequestRecord]] = {}
    for r in measured:
        by_worker.setdefault(r.worker, []).append(r)
    rows = []
    for w in sorted(workers, key=int):
        st, recs = workers[w], by_worker.get(int(w), [])
        lag = describe_array(np.asarray(st.get("loop_lag_s", []), float))
        window = st.get("send_window_s") or describe_array(np.empty(0))
        ok = [r for r in recs if r.status == "ok"]
        gaps = np.fromiter(itertools.chain.from_iterable(r.itl_s for r in ok), np.float64)
        gap = float(np.median(gaps)) if gaps.size else float("inf")
        stamps = st.get("timestamp_source", "user")
        delay = st.get("read_delay_s") or describe_array(np.empty(0))
        lag99 = lag["p99"]  # None: the run ended before the first sample (unknown)
        # how late the loop reads: its timer's lag, or (kernel stamps) each read's own wait
        late = None if lag99 is None else max(lag99, delay["p99"] or 0.0)
        receive = None if late is None else late if stamps != "kernel" or late > gap else 0.0
        bound = None if receive is None else (window["p99"] or 0.0) + receive
        rows.append(
            {
                "worker": int(w),
                "requests": len(recs),
                "timestamp_source": stamps,
                "loop_lag_s": lag,
                "send_lag_s": describe_array(np.asarray([r.send_lag_s for r in recs], float)),
                "send_window_s": window,
                "read_delay_s": delay,
                "cpu": describe_array(np.asarray(st.get("cpu", []), float)),
                "timing_bound_s": bound,
                "timing_bound_terms_s": {"send": window["p99"] or 0.0, "receive": receive},
            }
        )
    known = [x["timing_bound_s"] for x in rows if x["timing_bound_s"] is not None]
    worst = max(known, default=None)
    return {
        "workers": rows,
        "timing_bound_s": worst,
        "timing_bound_limit_s": TIMING_BOUND_LIMIT_S,
        "timing_bound_exceeded": worst is not None and worst > TIMING_BOUND_LIMIT_S,
    }


def _client_bound_reasons(send_lag: dict, client: dict, stamps: str = "user") -> list[str]:
    out = []
    p50, p99 = send_lag["p50"], send_lag["p99"]
    if p50 is not None and (p50 > SEND_LAG_P50_LIMIT_S or p99 > SEND_LAG_P99_LIMIT_S):
        out.append(f"send lag p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms behind schedule")
    lag99 = client["loop_lag_s"]["p99"]
    limit = LOOP_LAG_P99_LIMIT_S if stamps == "kernel" else LOOP_LAG_P99_LIMIT_USER_S
    if lag99 is not None and lag99 > limit:
        how = "kernel arrival stamps" if stamps == "kernel" else "user-space arrival stamps"
        out.append(f"event-loop lag p99 {lag99 * 1e3:.1f} ms ({how})")
    cpu = client["cpu"]["mean"]
    if cpu is not None and cpu > CPU_LIMIT:
        out.append(f"client CPU {cpu * 100:.0f}% of a core per worker")
    return out
