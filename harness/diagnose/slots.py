"""Batch slots while requests wait: was the server idle (a batcher waiting for a batch to
fill), full (every slot running), or were its slots *held* — a run-to-completion batch whose
finished members keep their slot until the batch's longest member ends, admitting nobody?

A held slot is not a free slot: under static or dynamic batching `running` falls inside a
batch while requests wait, and nobody is admitted until the batch ends. `queue-delay` must
not read those waits as a batching delay, and `hol-blocking` names them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from cbbench.harness.diagnose.base import RunView

ITERATION_LEVEL_SCHEDULERS = ("continuous",)  # the reference engine's iteration-level policy
ITERATION_LEVEL_ENGINES = ("vllm", "sglang", "tgi")  # refill a finished slot at the next step
RUN_TO_COMPLETION = ("static", "dynamic")  # the reference engine's request-level batchers
MIN_QUEUE_S = 0.02  # a queue time under this is no wait


def iteration_level(v: RunView) -> bool:
    return v.scheduler in ITERATION_LEVEL_SCHEDULERS or v.engine in ITERATION_LEVEL_ENGINES


def admitted_s(r) -> float | None:
    """When the server scheduled the request, on the client's clock: send + server queue."""
    if r.sent_s is None or r.server_queue_s is None:
        return None
    return r.sent_s + r.server_queue_s


def queue_busy_share(v: RunView) -> tuple[float, int] | None:
    """(share of the requests' summed server queue time during which another request was
    running, number of queued requests); None without server queue times."""
    spans = [(a, r.end_s) for r in v.ok if (a := admitted_s(r)) is not None and r.end_s]
    queued = [
        (r.sent_s, a)
        for r in v.ok
        if (a := admitted_s(r)) is not None and r.server_queue_s >= MIN_QUEUE_S  # type: ignore[operator]
    ]
    if not spans or not queued:
        return None
    starts: list[float] = []
    ends: list[float] = []
    for a, b in sorted(spans):  # the union of running intervals
        if ends and a <= ends[-1]:
            ends[-1] = max(ends[-1], b)
        else:
            starts.append(a)
            ends.append(b)
    lo, hi = np.asarray(starts), np.asarray(ends)
    cum = np.concatenate([[0.0], np.cumsum(hi - lo)])

    def covered(x: np.ndarray) -> np.ndarray:  # running time of the union up to each x
        i = np.searchsorted(lo, x, side="right") - 1
        j = np.maximum(i, 0)
        return np.where(i < 0, 0.0, cum[j] + np.minimum(x, hi[j]) - lo[j])

    a, b = np.asarray(queued, dtype=np.float64).T
    total = float((b - a).sum())
    busy = float((covered(b) - covered(a)).sum())
    return (busy / total if total > 0 else 0.0), len(queued)


@dataclass(frozen=True)
class HeldSlots:
    """The server's running/waiting gauges over the samples with requests waiting."""

    slots: float  # batch slots (running / batch occupancy, else the most running seen)
    waiting_samples: int  # samples with requests waiting
    batch_share: float  # ... of which a batch was running (the rest: an idle server)
    running_mean: float  # running, over the samples with waiting and a batch running
    waiting_mean: float
    idle_share: float  # 1 - running / slots, same samples: slots not running a request
    drops: int  # sample intervals in which running fell and waiting did not
    intervals: int  # consecutive sample pairs, both with waiting and a batch running
    kv_mean: float | None  # KV usage, same samples
    reserved_share: float | None  # KV reserved but unfilled / the pool, same samples
    refill_s: np.ndarray  # per request that ended while others waited: end -> next admission


def held_slots(v: RunView) -> HeldSlots | None:
    """None when the run has no running/waiting gauges (nothing to tell held from free)."""
    _, running = v.busy_series("running")
    _, waiting = v.busy_series("waiting")
    if running.size < 4 or running.size != waiting.size:
        return None
    _, occ = v.busy_series("batch_occupancy")
    on = occ > 0 if occ.size == running.size else np.zeros(0, bool)
    slots = float(np.median(running[on] / occ[on])) if on.any() else float(running.max())
    wait = waiting > 0
    busy = wait & (running > 0)
    if not busy.any() or slots <= 0:
        return None
    pairs = busy[:-1] & busy[1:]
    fell = pairs & (running[1:] < running[:-1]) & (waiting[1:] >= waiting[:-1])

    def mean_over_busy(name: str, scale: float = 1.0) -> float | None:
        _, s = v.busy_series(name)
        return float(s[busy].mean() / scale) if s.size == running.size else None

    info = v.engine_info
    pool = (info.get("num_kv_blocks") or 0) * (info.get("block_size") or 0)
    reserved = mean_over_busy("kv_reserved_unused_tokens", pool) if pool else None
    return HeldSlots(
        slots=slots,
        waiting_samples=int(wait.sum()),
        batch_share=float(busy.sum() / wait.sum()),
        running_mean=float(running[busy].mean()),
        waiting_mean=float(waiting[busy].mean()),
        idle_share=float(np.clip(1.0 - running[busy] / slots, 0.0, 1.0).mean()),
        drops=int(fell.sum()),
        intervals=int(pairs.sum()),
        kv_mean=mean_over_busy("kv_usage"),
        reserved_share=reserved,
        refill_s=_refill_times(v),
    )


def _refill_times(v: RunView) -> np.ndarray:
    """For each request that ended while another had been sent and not yet admitted: the time
    from its end (client clock) to the next admission. Iteration-level batching refills a
    freed slot at the next step; a run-to-completion batch only when its longest member ends."""
    adm = sorted((r.sent_s, a) for r in v.ok if (a := admitted_s(r)) is not None)
    ends = np.asarray([r.end_s for r in v.ok if r.end_s is not None], dtype=np.float64)
    if not adm or not ends.size:
        return np.empty(0)
    sent, when = np.asarray(adm, dtype=np.float64).T  # by send: the queue at an end is a prefix
    latest = np.maximum.accumulate(when)  # the latest admission among the first k sent
    times = np.sort(when)
    k = np.searchsorted(sent, ends, side="left")  # requests sent before each end
    waited = (k > 0) & (latest[np.maximum(k - 1, 0)] > ends)  # someone not yet admitted
    i = np.searchsorted(times, ends[waited], side="left")
    return times[i[i < times.size]] - ends[waited][i < times.size]
