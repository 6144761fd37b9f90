"""Low device use with memory to spare: too little load offered, or a batch cap
(max-num-seqs) that leaves requests waiting while KV blocks stay free.

Low use is not advice to offer more load when the requests failed: a run where most failed
(a killed server's refused connections, a rejected model) is the errors rule's; one whose
server went away late is qualified: its use covers the time the server answered."""

from __future__ import annotations

import numpy as np
from cbbench.harness.diagnose.base import Finding, Rule, RunView, fmt_ranges, pct, true_ranges
from cbbench.harness.diagnose.fixes import fixes_for
from cbbench.harness.results.outcome import failed_at, first_failure, server_gone

KV_SPARE = 0.6  # KV usage below this (max over the run) counts as memory to spare
FULL_BATCH = 0.95  # batch occupancy at or above this counts as a full batch
WAITING_SHARE = 0.5  # ... with requests waiting in at least this share of samples
LOW_USE = 0.35  # occupancy or GPU utilization (mean) below this counts as low
FAILED_SHARE = 0.5  # this share of the measured requests failed: low use says nothing of load


def _kv_spare(v: RunView) -> tuple[bool | None, float | None]:
    _, kv = v.busy_series("kv_usage")
    if not kv.size:
        return None, None
    return bool(kv.max() < KV_SPARE), float(kv.max())


def _use(v: RunView) -> tuple[str, np.ndarray, np.ndarray] | None:
    """The best utilisation signal recorded: GPU utilization, else batch occupancy."""
    t, util = v.busy_series("util_gpu", "gpu")
    if util.size >= 4:
        return "GPU utilization", t, util / 100.0
    t, occ = v.busy_series("batch_occupancy")
    if occ.size >= 4:
        return "batch occupancy", t, occ
    return None


def check_batch_cap(v: RunView) -> Finding | None:
    spare, kv_max = _kv_spare(v)
    if not spare:
        return None
    tw, waiting = v.busy_series("waiting")
    tr, running = v.busy_series("running")
    if waiting.size < 4 or running.size != waiting.size or running.max() < 1:
        return None
    _, occ = v.busy_series("batch_occupancy")
    if occ.size == running.size:
        full = occ >= FULL_BATCH  # the engine says how many slots it has
        cap_text = "every batch slot"
    else:
        full = running >= FULL_BATCH * running.max()
        cap_text = f"its maximum of {running.max():.0f} running"
    capped = full & (waiting > 0)
    if capped.mean() < WAITING_SHARE:
        return None
    ranges = true_ranges(tw, capped)
    return Finding(
        rule=BATCH_CAP.id,
        title="requests wait while the batch is capped and KV memory is free",
        cause="the batch limit (max-num-seqs / batch size) is smaller than the load and the "
        "memory allow: requests queue although KV blocks stay unused",
        evidence=[
            f"the server ran {cap_text} with requests waiting in {pct(capped.mean())} of samples"
            f" ({fmt_ranges(ranges)})",
            f"running: max {running.max():.0f}, mean {running.mean():.1f}; waiting: mean "
            f"{waiting.mean():.1f}, max {waiting.max():.0f}",
            f"KV cache usage never above {pct(kv_max)}",
        ],
        fixes=fixes_for("batch-cap"),
        time_ranges=ranges,
        values={
            "capped_fraction": float(capped.mean()),
            "running_max": float(running.max()),
            "waiting_mean": float(waiting.mean()),
            "kv_usage_max": kv_max,
        },
    )


def _went_away(v: RunView) -> str | None:
    """When requests failed on connection errors (the server went away): from when, and how
    many; None when none did."""
    lost = [r for r in v.measured if not r.ok and server_gone(r)]
    if not lost:
        return None
    at = failed_at(first_failure(lost))
    when = f" from +{at:.1f} s" if at is not None else ""
    return f"{len(lost)} of {len(v.measured)} requests failed on connection errors{when}"


def check_low_concurrency(v: RunView) -> Finding | None:
    failed = len(v.measured) - len(v.ok)
    if v.measured and failed >= FAILED_SHARE * len(v.measured):
        return None  # the server went away or refused them: the errors rule says which
    spare, kv_max = _kv_spare(v)
    if spare is False:
        return None
    use = _use(v)
    if use is None:
        return None
    what, t, u = use
    _, waiting = v.busy_series("waiting")
    if u.mean() >= LOW_USE or (waiting.size and waiting.mean() >= 0.5):
        return None
    _, running = v.busy_series("running")
    load = v.meta.get("load") or {}
    evidence = [f"{what} mean {pct(u.mean())} (max {pct(u.max())}) over the run"]
    if running.size:
        evidence.append(
            f"running requests: mean {running.mean():.1f}, max {running.max():.0f}; nothing waiting"
        )
    if load.get("concurrency"):
        evidence.append(f"the client kept at most {load['concurrency']} requests in flight")
    elif load.get("rate"):
        evidence.append(f"the client offered {load['rate']} requests/s")
    evidence.append(
        f"KV cache usage never above {pct(kv_max)}"
        if kv_max is not None
        else "KV usage not exported by this server"
    )
    low = u < LOW_USE
    cause = (
        "too few requests in flight to fill a batch: throughput is limited by the offered "
        "load, not by the server"
    )
    gone = _went_away(v)
    if gone:  # the use above is of the time it answered; the rest is the errors rule's
        evidence.append(f"{gone}: the use above covers the time the server answered")
        cause += " (while the server answered; it then went away)"
    return Finding(
        rule=LOW_CONCURRENCY.id,
        title="the server was under-used: little in flight, memory to spare",
        cause=cause,
        evidence=evidence,
        fixes=fixes_for("low-concurrency"),
        severity="info",
        time_ranges=true_ranges(t, low),
        values={"use_signal": what, "use_mean": float(u.mean()), "kv_usage_max": kv_max},
    )


BATCH_CAP = Rule(
    "batch-cap", "full batch with requests waiting while KV memory is free", check_batch_cap
)
LOW_CONCURRENCY = Rule(
    "low-concurrency", "low device use, nothing waiting, memory to spare", check_low_concurrency
)
