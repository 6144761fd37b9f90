"""The client was the bottleneck: sends fell behind schedule, or the load generator's event
loop or CPU was saturated, so the numbers describe the client as much as the server."""

from __future__ import annotations

import numpy as np
from cbbench.harness.diagnose.base import Finding, Rule, RunView, fmt_ranges, ms, pct, true_ranges
from cbbench.harness.diagnose.fixes import fixes_for

SEND_LAG_P50_S = 0.010  # median send lag over this: the client sends late as a rule
LATE_S = 0.050  # ... or at least LATE_SHARE of the sends (and 3) this late
LATE_SHARE = 0.1
START_GRACE_S = 0.5  # sends scheduled this early are left out when enough others remain
LOOP_LAG_P50_S = 0.02  # median event-loop lag of the 0.1 s probes
CPU = 0.9  # fraction of one core per worker


def check(v: RunView) -> Finding | None:
    reasons: list[str] = []
    values: dict = {}
    ranges: list[tuple[float, float]] = []
    sched = [r for r in v.measured if r.scheduled_s is not None and r.send_lag_s is not None]
    steady = [r for r in sched if r.scheduled_s >= START_GRACE_S]  # type: ignore[operator]
    sched = steady if len(steady) >= 5 else sched  # connections open during the first sends
    if len(sched) >= 5:
        lag = np.asarray([r.send_lag_s for r in sched], dtype=np.float64)
        p50, p99 = float(np.median(lag)), float(np.percentile(lag, 99))
        values.update(send_lag_p50_s=p50, send_lag_p99_s=p99)
        late = [r for r in sched if r.send_lag_s > LATE_S]  # type: ignore[operator]
        if p50 > SEND_LAG_P50_S or (len(late) >= max(3, LATE_SHARE * len(sched))):
            late = late or [r for r in sched if r.send_lag_s > SEND_LAG_P50_S]  # type: ignore[operator]
            reasons.append(
                f"requests went out behind their schedule: send lag p50 {ms(p50)}, p99 "
                f"{ms(p99)}, max {ms(float(lag.max()))} ({len(late)} of {len(sched)} over {ms(LATE_S)} late)"
            )
            if late:
                ranges.append((min(r.scheduled_s for r in late), max(r.sent_s for r in late)))  # type: ignore[type-var]
    # the median of every 0.1 s probe: one slow moment on a shared machine is not enough
    loop = ((v.meta.get("summary") or {}).get("client") or {}).get("loop_lag_s") or {}
    if isinstance(loop.get("p50"), (int, float)):
        values["loop_lag_p50_s"] = loop["p50"]
        if loop["p50"] > LOOP_LAG_P50_S:
            t, lag = v.series("loop_lag_max_s", "client")
            where = fmt_ranges(true_ranges(t, lag > LOOP_LAG_P50_S)) if lag.size else ""
            reasons.append(
                f"the load generator's event loop lagged p50 {ms(loop['p50'])}, p99 "
                f"{ms(loop.get('p99'))} behind its 0.1 s timer" + (f": {where}" if where else "")
            )
    _, cpu = v.series("cpu", "client")
    if cpu.size:
        values["client_cpu_mean"] = float(cpu.mean())
        if cpu.mean() > CPU:
            reasons.append(f"client CPU {pct(float(cpu.mean()))} of a core per worker")
    if not reasons:
        return None
    return Finding(
        rule=RULE.id,
        title="the client was the bottleneck",
        cause="the load generator could not keep up with the load it was asked to offer, so "
        "latencies include client delays and the offered rate was lower than requested",
        evidence=reasons,
        fixes=fixes_for("client-bound"),
        time_ranges=ranges,
        values=values,
    )


RULE = Rule(
    "client-bound", "sends behind schedule, a lagging event loop or a busy client CPU", check
)
