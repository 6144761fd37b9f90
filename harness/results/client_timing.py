"""Whether the client's own timing can be trusted, judged against the figures it affects
(moved out of summary.py, which calls it):
- `worker_timing`: per load-generator worker, a bound on the p99 error of its timestamps; the
  run's worst bound is flagged only when it is a material share of the latencies it affects;
- `client_bound_reasons`: why the client, not the server, set the pace: sustained send or
  event-loop lag, or a busy CPU, never one sample.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from cbbench.harness.results.records import RequestRecord
from cbbench.workloads.stats import describe_array

# The client set the pace when any of these is exceeded (seconds, or a fraction of one core).
SEND_LAG_P50_LIMIT_S = 0.002
SEND_LAG_P99_LIMIT_S = 0.010
LOOP_LAG_P99_LIMIT_S = 0.020  # kernel arrival stamps: loop lag delays reads, not their times
# user-space stamps: a read's time is when the loop got to it, so loop lag is timing error;
# flag it before that error passes 5 ms
LOOP_LAG_P99_LIMIT_USER_S = 0.005
CPU_LIMIT = 0.90
# Sustained, not one sample: a lag limit counts as exceeded when at least this many samples
# (and this share of them) exceed it; one outlier among 30 requests is not a client limit.
SUSTAINED_MIN_SAMPLES = 3
SUSTAINED_SHARE = 0.05
# A worker's bound on its p99 timing error is flagged when it is a material share of the
# latencies it affects (TTFT p50, else E2E p50) and above TIMING_BOUND_LIMIT_S (a bound
# under 1 ms changes no conclusion); it is always printed as "± x ms" beside them.
TIMING_BOUND_LIMIT_S = 0.001
TIMING_BOUND_MATERIAL_SHARE = 0.10
# Kernel stamps: a late read errs only by merging segments, which stamps their events alike
# (a zero gap); merged in under this share of first tokens and of gaps, a p99 is not moved.
MERGED_SHARE = 0.01


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
      when it exceeds the gap between tokens (ITL p50 of the worker's records) and seen only
      when events share a stamp (zero gaps: `merged_share` >= MERGED_SHARE), else 0."""
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
        merged = merged_share(ok)
        # kernel stamps: late reads err only where they merged segments (> a gap late, and
        # seen: more than the p99 can ignore of first tokens or gaps stamped together)
        can_merge = late is not None and late > gap and merged >= MERGED_SHARE
        receive = None if late is None else late if stamps != "kernel" or can_merge else 0.0
        bound = None if receive is None else (window["p99"] or 0.0) + receive
        # kernel stamps: each request's own bound (its send window + how much earlier than
        # its read's stamp its first token may have come), request-weighted like the error
        per_request = request_bound_p99(ok) if stamps == "kernel" else None
        if per_request is not None:  # it counts each merge as late as the loop was there:
            bound = per_request  # the sampled term (a p99 lateness on every read) is not needed
        cpu = describe_array(np.asarray(st.get("cpu", []), float))
        rows.append(
            {
                "worker": int(w),
                "requests": len(recs),
                "timestamp_source": stamps,
                "loop_lag_s": lag,
                "send_lag_s": describe_array(np.asarray([r.send_lag_s for r in recs], float)),
                "send_window_s": window,
                "read_delay_s": delay,
                "cpu": cpu,
                "timing_bound_s": bound,
                "merged_share": merged,
                "timing_bound_terms_s": {"send": window["p99"] or 0.0, "receive": receive},
                "request_bound_s": per_request,
                "stall": stall_cause(late, gap, cpu),
            }
        )
    known = [x["timing_bound_s"] for x in rows if x["timing_bound_s"] is not None]
    worst = max(known, default=None)
    label, figure = _timing_reference(measured)
    limit = max(TIMING_BOUND_LIMIT_S, TIMING_BOUND_MATERIAL_SHARE * (figure or 0.0))
    return {
        "workers": rows,
        "timing_bound_s": worst,
        "timing_bound_limit_s": limit,
        "timing_bound_judged_against": label,
        "timing_bound_reference_s": figure,  # the judged-against figure's value
        "timing_bound_exceeded": figure is not None and worst is not None and worst > limit,
    }


def request_bound_p99(ok: Sequence[RequestRecord]) -> float | None:
    """p99 over requests of each one's bound on its TTFT error (`stamp_bound_s`, the raw
    client with kernel stamps: its send window, plus, when its first token shared a read
    with a later event, the time from the later of the send and the loop's turn mark
    before last to that read's stamp; response.py, client/turns.py). Each request's error
    is at most its bound, so the p99 of the errors is at most this, however a stall fell.
    None when no request has one."""
    bounds = [r.extra["stamp_bound_s"] for r in ok if "stamp_bound_s" in r.extra]
    return float(np.percentile(bounds, 99)) if bounds else None


def stall_cause(late: float | None, gap: float, cpu: dict) -> str | None:
    """Which resource ran out when a worker's loop read late (p99 lateness over a token
    gap, or 5 ms): its own CPU (the worker used CPU_LIMIT of a core or more: its loop was
    busy) or a core to run on (it used less: runnable, waiting for a CPU the machine's
    other processes held). None: no stall worth a cause."""
    if late is None or late <= min(gap, 0.005):
        return None
    share = cpu.get("p90") if cpu.get("count") else None
    if share is not None and share >= CPU_LIMIT:
        return f"client CPU: the loop was busy ({share * 100:.0f}% of a core, p90)"
    used = "" if share is None else f"; it used {share * 100:.0f}% of a core, p90"
    return f"a CPU core: the worker waited to run while its loop was {late * 1e3:.1f} ms late{used}"


def merged_share(ok: Sequence[RequestRecord]) -> float:
    """The share of token gaps, or of requests' first gaps, that are exactly 0: events one read
    delivered together (a kernel-stamped read stamps them all with its last segment's time; a
    server that writes several events at once shows here too, so this is an upper bound)."""
    firsts = [r.itl_s[0] == 0.0 for r in ok if r.itl_s]
    gaps = sum(len(r.itl_s) for r in ok)
    zero = sum(1 for r in ok for x in r.itl_s if x == 0.0)
    return max(zero / gaps if gaps else 0.0, sum(firsts) / len(firsts) if firsts else 0.0)


def _timing_reference(measured: Sequence[RequestRecord]) -> tuple[str | None, float | None]:
    """The figure a timing error matters against: the successful requests' TTFT p50, else
    (not streamed) their E2E p50; (None, None) when nothing was measured."""
    for name, attr in (("TTFT p50", "ttft_s"), ("E2E p50", "e2e_s")):
        values = [getattr(r, attr) for r in measured if r.status == "ok"]
        values = [v for v in values if v is not None]
        if values:
            return name, float(np.median(values))
    return None, None


def _sustained(samples: np.ndarray, limit: float) -> bool:
    """More than one sample past the limit: at least SUSTAINED_MIN_SAMPLES and a
    SUSTAINED_SHARE of them (fewer samples than that never make a verdict)."""
    samples = samples[~np.isnan(samples)]
    over = int(np.sum(samples > limit))
    return over >= max(SUSTAINED_MIN_SAMPLES, SUSTAINED_SHARE * samples.size)


def client_bound_reasons(
    send_lag: np.ndarray, loop_lag: np.ndarray, client: dict, stamps: str = "user"
) -> list[str]:
    """Why the client, not the server, set the pace; each reason needs sustained lag
    (`_sustained`), never one sample."""
    out = []
    lag = describe_array(send_lag)
    p50, p99 = lag["p50"], lag["p99"]
    late = _sustained(send_lag, SEND_LAG_P99_LIMIT_S)
    # a median needs SUSTAINED_MIN_SAMPLES sends too: 2 sends 2.1 ms late read as CLIENT-BOUND
    typical = lag["count"] >= SUSTAINED_MIN_SAMPLES and p50 > SEND_LAG_P50_LIMIT_S
    if p50 is not None and (typical or late):
        n = int(np.sum(send_lag > SEND_LAG_P99_LIMIT_S))
        out.append(
            f"send lag p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms behind schedule "
            f"({n} of {lag['count']} sends > {SEND_LAG_P99_LIMIT_S * 1e3:.0f} ms late)"
        )
    lag99 = client["loop_lag_s"]["p99"]
    limit = LOOP_LAG_P99_LIMIT_S if stamps == "kernel" else LOOP_LAG_P99_LIMIT_USER_S
    if lag99 is not None and _sustained(loop_lag, limit):
        how = "kernel arrival stamps" if stamps == "kernel" else "user-space arrival stamps"
        out.append(f"event-loop lag p99 {lag99 * 1e3:.1f} ms ({how})")
    cpu = client["cpu"]
    if cpu["mean"] is not None and cpu["count"] >= SUSTAINED_MIN_SAMPLES and cpu["mean"] > CPU_LIMIT:
        out.append(f"client CPU {cpu['mean'] * 100:.0f}% of a core per worker")
    return out
