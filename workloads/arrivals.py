"""Arrival processes: give a workload's requests their send times, changing nothing else.

Sessions (requests sharing a session_id): the process times each session's first turn, and a
session's later turns get no arrival time (they follow their replies); `rate` counts sessions.

Kinds: all-at-once (closed loop: arrival_s = None), constant, poisson, gamma (cv = burstiness;
cv = 1 is Poisson, > 1 burstier, < 1 smoother) and replay (the trace's own timestamps, sped up by
`time_scale` or rescaled to `target_rate` with the burst structure kept). The first request
arrives at 0.0. Gaps come from their own random stream, so the request set (lengths, order,
indices) is the same whatever the arrival process.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from cbbench.workloads.errors import WorkloadError
from cbbench.workloads.spec import Workload

ARRIVAL_KINDS = ("all-at-once", "constant", "poisson", "gamma", "replay")
ARRIVAL_STREAM = 6  # stream id mixed into the seed; lengths use other ids


def _positive(name: str, value: float | None, kind: str) -> float:
    if value is None or not math.isfinite(value) or value <= 0:
        raise WorkloadError(f"arrival '{kind}' needs {name} > 0, got {value!r}")
    return float(value)


def _gaps(kind: str, n: int, rate: float, cv: float, seed: int) -> np.ndarray:
    """n - 1 inter-arrival gaps with mean 1 / rate."""
    rng = np.random.default_rng([seed, ARRIVAL_STREAM])
    m = max(n - 1, 0)
    if kind == "constant":
        return np.full(m, 1.0 / rate)
    if kind == "poisson":
        return rng.exponential(1.0 / rate, size=m)
    shape = 1.0 / (cv * cv)  # gamma: mean = shape * scale, CV = 1 / sqrt(shape)
    return rng.gamma(shape, 1.0 / (rate * shape), size=m)


def _starts_session(r) -> bool:
    """A request the arrival process times: a single request, or a session's first turn."""
    return r.session_id is None or (r.turn or 1) <= 1


def _replay(wl: Workload, time_scale: float, target_rate: float | None) -> np.ndarray:
    """Replayed times; a session's think times are scaled with them (see `with_arrivals`)."""
    times = [r.arrival_s for r in wl.requests]
    if any(t is None for t in times):
        raise WorkloadError(f"{wl.name}: replay needs a trace with arrival times")
    t = np.asarray(times, dtype=np.float64)
    if len(t) and np.any(np.diff(t) < 0):
        raise WorkloadError(f"{wl.name}: replay needs arrival times in order")
    t = t - t[0] if len(t) else t
    if target_rate is not None:
        span = t[-1] if len(t) else 0.0
        if len(t) < 2 or span <= 0:
            raise WorkloadError(f"{wl.name}: target_rate needs >= 2 requests spread over time")
        return (t / span) * ((len(t) - 1) / target_rate)  # normalise first: no overflow
    return t / time_scale


def _ramp(t: np.ndarray, ramp_up_s: float) -> np.ndarray:
    """Warp times so the rate rises linearly from 0 to full over ramp_up_s, then stays.

    A stream at full rate has cumulative count rate * u by time u; with a linear ramp over R the
    count by time t is rate * t^2 / (2R) for t < R and rate * (t - R/2) after. Solving for t maps
    each u: t = sqrt(2 R u) while u < R/2, else u + R/2.
    """
    r = ramp_up_s
    return np.where(t < r / 2, np.sqrt(2 * r * np.maximum(t, 0.0)), t + r / 2)


def with_arrivals(
    wl: Workload,
    kind: str,
    rate: float | None = None,
    cv: float = 1.0,
    seed: int | None = None,
    time_scale: float = 1.0,
    target_rate: float | None = None,
    ramp_up_s: float = 0.0,
) -> Workload:
    """A copy of `wl` whose requests carry arrival times from `kind`; see the module doc.

    `seed` seeds the gaps (default: the workload's seed)."""
    seed = wl.seed if seed is None else seed
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise WorkloadError(f"arrival seed must be an integer >= 0, got {seed!r}")
    if kind not in ARRIVAL_KINDS:
        raise WorkloadError(f"unknown arrival kind {kind!r} (one of {', '.join(ARRIVAL_KINDS)})")
    if not math.isfinite(ramp_up_s) or ramp_up_s < 0:
        raise WorkloadError(f"ramp_up_s must be >= 0, got {ramp_up_s!r}")
    if kind == "all-at-once":
        if ramp_up_s:
            raise WorkloadError("ramp_up_s needs an open-loop arrival kind, not all-at-once")
        times: list[float | None] = [None] * len(wl)
    else:
        if kind == "replay":
            _positive("time_scale", time_scale, kind)
            if target_rate is not None:
                _positive("target_rate", target_rate, kind)
                if time_scale != 1.0:
                    raise WorkloadError("replay takes time_scale or target_rate, not both")
            t = _replay(wl, time_scale, target_rate)
        else:
            rate = _positive("rate", rate, kind)
            if kind == "gamma":
                cv = _positive("cv", cv, kind)
            starts = [i for i, r in enumerate(wl.requests) if _starts_session(r)]
            gaps = _gaps(kind, len(starts), rate, cv, seed)
            t = np.concatenate([[0.0], np.cumsum(gaps)]) if starts else gaps
        if ramp_up_s:
            t = _ramp(t, ramp_up_s)
        if kind == "replay":
            times = [float(x) for x in t]
        else:  # sessions start by the process; later turns follow their replies (think_s)
            times = [None] * len(wl)
            for i, x in zip(starts, t, strict=True):
                times[i] = float(x)
    speedup = 1.0
    if kind == "replay":
        span = [r.arrival_s for r in wl.requests if r.arrival_s is not None]
        trace_span = (max(span) - min(span)) if span else 0.0
        new_span = max((x for x in times if x is not None), default=0.0)
        speedup = trace_span / new_span if trace_span > 0 and new_span > 0 else time_scale

    def think(r) -> float | None:
        return None if r.think_s is None else r.think_s / speedup

    requests = tuple(
        dataclasses.replace(r, arrival_s=a, think_s=think(r))
        for r, a in zip(wl.requests, times, strict=True)
    )
    arrival = {"kind": kind, "rate": rate, "cv": cv, "seed": seed, "time_scale": time_scale}
    arrival |= {"target_rate": target_rate, "ramp_up_s": ramp_up_s}
    source = dict(wl.source) | {"arrival": arrival}
    return dataclasses.replace(wl, requests=requests, source=source)
