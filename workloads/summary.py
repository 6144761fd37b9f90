"""Summary statistics of a workload: what `cbbench workload show` prints and run.json keeps.

Percentiles use numpy's default (linear interpolation, the same as pandas' `quantile`).
Mean rate = (count - 1) / duration, the arrivals per second between the first and the last
request; burstiness = CV (population std / mean) of the inter-arrival gaps: 1 for Poisson.
"""

from __future__ import annotations

import numpy as np
from cbbench.workloads.graph import graph_stats
from cbbench.workloads.spec import Workload

PERCENTILES = (50, 90, 95, 99)


def describe_lengths(values: np.ndarray) -> dict:
    if not len(values):
        return {"count": 0}
    out = {"count": int(len(values)), "mean": float(values.mean()), "min": int(values.min())}
    for q in PERCENTILES:
        out[f"p{q}"] = float(np.percentile(values, q))
    out["max"] = int(values.max())
    out["total"] = int(values.sum())
    return out


def summarize_workload(wl: Workload) -> dict:
    prompt = np.asarray([r.prompt_len for r in wl.requests], dtype=np.int64)
    output = np.asarray([r.output_len for r in wl.requests], dtype=np.int64)
    summary: dict = {
        "name": wl.name,
        "seed": wl.seed,
        "count": len(wl),
        "open_loop": wl.open_loop,
        "prompt_len": describe_lengths(prompt),
        "output_len": describe_lengths(output),
        "duration_s": None,
        "mean_rate": None,
        "burstiness": None,
        "rows_skipped": dict(wl.source.get("rows_skipped", {})),
    }
    if wl.open_loop:
        # sessions: only first turns carry arrival times (later ones follow their replies)
        t = np.asarray(
            [r.arrival_s for r in wl.requests if r.arrival_s is not None], dtype=np.float64
        )
        duration = float(t.max() - t.min())
        summary["duration_s"] = duration
        if len(t) >= 2 and duration > 0:
            gaps = np.diff(np.sort(t))
            summary["mean_rate"] = (len(t) - 1) / duration
            summary["burstiness"] = float(gaps.std() / gaps.mean())
    shared = sum(1 for r in wl.requests if r.prefix_ids)
    if shared:
        summary["with_prefix_ids"] = shared
    sessions = _sessions(wl)
    if sessions:
        summary["sessions"] = sessions
    graph = graph_stats(wl.requests)
    if graph:
        summary["graph"] = graph
    intended = (wl.source.get("shared_prefix") or {}).get("intended_hit_rate")
    if intended:  # shared-prefix: what a prefix cache should serve (primed, cold)
        summary["intended_hit_rate"] = dict(intended)
    return summary


def _sessions(wl: Workload) -> dict | None:
    turns: dict[str, int] = {}
    for r in wl.requests:
        if r.session_id is not None:
            turns[r.session_id] = turns.get(r.session_id, 0) + 1
    if not turns:
        return None
    think = np.asarray([r.think_s for r in wl.requests if r.think_s is not None], np.float64)
    counts = np.asarray(list(turns.values()), dtype=np.int64)
    return {
        "count": len(turns),
        "multi_turn": int((counts > 1).sum()),
        "turns": describe_lengths(counts),
        "think_s_p50": float(np.percentile(think, 50)) if len(think) else None,
    }
