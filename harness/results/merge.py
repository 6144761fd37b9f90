"""Shard run folders -> one run folder (`cbbench merge OUT DIR...`).

Each host of an N-host run (`cbbench bench --shard I/N`) writes its own folder; `merge_runs`
checks they are the N parts of one run (the same workload, digest, shard count, load and
start time; each shard once, none missing unless `allow_missing`), keeps every record once,
and recomputes the summary from the merged records with the same `summarize` a single process
uses, fed with every worker's raw self-check samples (run.json's `shard.client_samples`),
and `bench`'s prefix-cache and agent parts (`add_cache_summaries`; primed or flushed when
every shard was).

Alignment: a record's times are seconds from its shard's t0; each shard's t0 on the wall
clock is in its run.json (`clock.t0_unix_s`). Shards started with one `--start-at` share it
exactly, so their records are kept as written; otherwise each shard's records move by its
t0's distance from the earliest (`shift_s`), as good as the hosts' clocks agree.

Workers are renumbered run-wide: shard 0's workers first, then shard 1's, ...; with one
worker a shard, worker k is shard k. Every worker's timing row (`summary.client.workers`)
names its shard; `summary.shards` has one row per shard (its planned and recorded requests,
workers, worst timing bound, t0, how late it started, its kernel clock state).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from cbbench.harness.errors import CbbenchError
from cbbench.harness.results.agent_summary import add_cache_summaries
from cbbench.harness.results.integrity import RECORDS_KEY, record_counts
from cbbench.harness.results.outcome import stopped_answering
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.run_folder import REQUESTS_FILE, Run, RunWriter, load_run
from cbbench.harness.results.efficiency import add_telemetry_figures
from cbbench.harness.results.summary import RunSummary, summarize
from cbbench.workloads.stats import describe_array

# what shards of one run agree on: (where in run.json, what to call it)
SAME = (
    (("shard", "count"), "shard count"),
    (("shard", "workload_digest"), "workload digest"),
    (("workload", "seed"), "workload seed"),
    (("workload", "num_requests"), "workload size"),
    (("shard", "concurrency_total"), "concurrency"),
    (("load", "mode"), "load mode"),
    (("load", "rate"), "rate"),
    (("load", "burstiness"), "burstiness"),
    (("load", "arrival"), "arrival"),
    (("load", "warmup"), "warmup"),
    (("load", "duration_s"), "duration"),
    (("load", "stream"), "streaming"),
    (("load", "cap_unit"), "cap unit"),
    (("load", "slo_s"), "SLOs"),
    (("target", "model"), "model"),
    (("target", "endpoint"), "endpoint"),
    (("clock", "start_at_unix_s"), "--start-at"),
)
START_SKEW_LIMIT_S = 0.25  # shards without one --start-at: t0s further apart are refused
_ABSOLUTE = ("scheduled_s", "ready_s", "sent_s", "first_token_s", "last_token_s", "end_s")
_CONNECTION_COUNTS = ("opened", "prewarmed", "reused", "closed_by_server", "retried", "user_reads")


@dataclass
class MergeResult:
    run_dir: Path
    meta: dict
    summary: RunSummary
    records: list[RequestRecord]
    missing: list[int]  # shard indices not merged (only with allow_missing)


def _get(meta: dict, path: tuple[str, ...]) -> Any:
    for key in path:
        meta = meta.get(key) if isinstance(meta, dict) else None
    return meta


def _shard_of(run: Run) -> dict:
    shard = run.meta.get("shard")
    if not isinstance(shard, dict) or not isinstance(shard.get("index"), int):
        raise CbbenchError(
            f"{run.dir}: not a shard run (its run.json has no shard; made by cbbench bench "
            "--shard I/N)"
        )
    if run.meta.get("status") == "running" or "client_samples" not in shard:
        raise CbbenchError(
            f"{run.dir}: shard {shard['index']}/{shard.get('count')} has not finished (run.json "
            "still says running: in progress, or killed); leave it out with --allow-missing"
        )
    return shard


def _check_shards(runs: list[Run], allow_missing: bool) -> tuple[list[Run], list[int]]:
    """The runs in shard order and the shard indices missing; CbbenchError on a mismatch."""
    first = runs[0]
    by_index: dict[int, Run] = {}
    for run in runs:
        shard = _shard_of(run)
        for path, what in SAME:
            a, b = _get(first.meta, path), _get(run.meta, path)
            if a != b:
                raise CbbenchError(
                    f"{run.dir}: {what} {b!r} differs from {first.dir}'s {a!r}: not shards of "
                    "one run"
                )
        index = shard["index"]
        if index in by_index:
            raise CbbenchError(
                f"shard {index}/{shard['count']} given twice: {by_index[index].dir} and {run.dir}"
            )
        by_index[index] = run
    count = first.meta["shard"]["count"]
    missing = [i for i in range(count) if i not in by_index]
    if missing and not allow_missing:
        names = ", ".join(f"{i}/{count}" for i in missing)
        raise CbbenchError(
            f"missing shard(s) {names}: give every shard's folder, or --allow-missing to merge "
            "without them"
        )
    return [by_index[i] for i in sorted(by_index)], missing


def _shift(rec: RequestRecord, delta_s: float) -> None:
    for name in _ABSOLUTE:
        v = getattr(rec, name)
        if v is not None:
            setattr(rec, name, v + delta_s)
    rec.token_times_s = [t + delta_s for t in rec.token_times_s]


def _connections(records: list[RequestRecord], shard_summaries: list[dict]) -> dict:
    """The shards' pool counts added up; the cold-start figures from the merged records (as
    the runner's `connection_summary` computes them for one process)."""
    pools = [s.get("connections") or {} for s in shard_summaries]
    out: dict = {}
    for k in _CONNECTION_COUNTS:
        values = [p[k] for p in pools if p.get(k) is not None]
        out[k] = sum(values) if values else None
    cold = [r.connect_s for r in records if not r.warmup and r.connect_s is not None]
    out["requests_on_new_connection"] = len(cold)
    out["connect_s"] = describe_array(np.asarray(cold, dtype=float))
    return out


def start_skew(runs: list[Run], t0s: list[float | None], ref_t0: float | None) -> str | None:
    """Each late shard's real start offset ("shard 1/2 +3.70 s") when shards without one
    --start-at started more than START_SKEW_LIMIT_S apart; None when they did not."""
    if ref_t0 is None or _get(runs[0].meta, ("clock", "start_at_unix_s")) is not None:
        return None
    late = [
        (run.meta["shard"], t0 - ref_t0)
        for run, t0 in zip(runs, t0s, strict=True)
        if t0 is not None and t0 - ref_t0 > 0
    ]
    if not late or max(d for _, d in late) <= START_SKEW_LIMIT_S:
        return None
    offsets = ", ".join(f"shard {sh['index']}/{sh['count']} +{d:.2f} s" for sh, d in late)
    return f"started after the first shard: {offsets}"


def merge_runs(
    out_dir: str | Path,
    run_dirs: list[str | Path],
    *,
    allow_missing: bool = False,
    allow_start_skew: bool = False,
    name: str | None = None,
    command: list[str] | None = None,
    conclude: Callable[[dict, list[RequestRecord], list[dict]], None] | None = None,
) -> MergeResult:
    """Merge the shard folders `run_dirs` into a new run folder `out_dir`. `conclude(summary,
    records, shard metas)` adds what a later layer concludes from the merged records (the
    steady window: harness/conclusions/merge_window.py) before run.json is written."""
    out = Path(out_dir)
    if not run_dirs:
        raise CbbenchError("merge: give the shard run folders to merge")
    if (out / REQUESTS_FILE).exists():
        raise CbbenchError(f"{out}: already holds a run; choose another output folder")
    runs, missing = _check_shards([load_run(d) for d in run_dirs], allow_missing)
    t0s = [_get(r.meta, ("clock", "t0_unix_s")) for r in runs]
    ref_t0 = min((t for t in t0s if t is not None), default=None)
    skew = start_skew(runs, t0s, ref_t0)
    if skew and not allow_start_skew:
        raise CbbenchError(
            f"the shards started apart without a common --start-at ({skew}): their loads "
            "overlapped only in part, so the merged rate and concurrency are not the run's; "
            "rerun them with one --start-at, or pass --allow-start-skew to merge them anyway"
        )

    records: list[RequestRecord] = []
    timeseries: list[dict] = []
    client: dict = {"loop_lag_s": [], "cpu": [], "workers": {}}
    seen: dict[tuple[bool, int], Path] = {}
    rows, sources, shard_of_worker = [], set(), {}
    telemetry_run = next((r for r in runs if (r.meta.get("summary") or {}).get("telemetry")), None)
    offset = 0
    for run, t0 in zip(runs, t0s, strict=True):
        shard, samples = run.meta["shard"], run.meta["shard"]["client_samples"]
        shift_s = 0.0 if t0 is None or ref_t0 is None else t0 - ref_t0
        local = {int(w) for w in samples.get("workers", {})} | {r.worker for r in run.records}
        n_workers = max(int(run.meta["load"].get("workers") or 1), max(local, default=0) + 1)
        for rec in run.records:
            key = (rec.warmup, rec.index)
            if key in seen:
                raise CbbenchError(f"request {rec.index} is in both {seen[key]} and {run.dir}")
            seen[key] = run.dir
            if shift_s:
                _shift(rec, shift_s)
            rec.worker += offset
            records.append(rec)
        for sample in run.timeseries:
            if sample.get("source") != "client" and run is not telemetry_run:
                continue  # one server seen by N hosts: its series once, from one shard
            sample = {**sample, "shard": shard["index"]}
            if isinstance(sample.get("t_s"), (int, float)):
                sample["t_s"] += shift_s
            if isinstance(sample.get("worker"), int):
                sample["worker"] += offset
            timeseries.append(sample)
        client["loop_lag_s"] += samples.get("loop_lag_s", [])
        client["cpu"] += samples.get("cpu", [])
        sources.add(samples.get("timestamp_source", "user"))
        for w, st in samples.get("workers", {}).items():
            client["workers"][offset + int(w)] = st
        workers = list(range(offset, offset + n_workers))
        shard_of_worker.update(dict.fromkeys(workers, shard["index"]))
        rows.append(
            {
                "shard": shard["index"],
                "dir": str(run.dir),
                "requests": shard.get("requests"),
                "recorded": sum(not r.warmup for r in run.records),
                "workers": workers,
                "status": run.meta.get("status"),
                "base_url": _get(run.meta, ("target", "base_url")),
                "hostname": _get(run.meta, ("environment", "hostname")),
                "t0_unix_s": t0,
                "shift_s": shift_s,
                "late_start_s": _get(run.meta, ("clock", "late_start_s")),
                "clock": _get(run.meta, ("clock", "kernel")),
            }
        )
        offset += n_workers
    client["timestamp_source"] = "kernel" if sources == {"kernel"} else "user"
    records.sort(key=lambda r: (r.end_s if r.end_s is not None else float("inf"), r.index))
    timeseries.sort(key=lambda s: s.get("t_s") if isinstance(s.get("t_s"), (int, float)) else 0)

    first = runs[0].meta
    slo = first["load"].get("slo_s") or {}
    summary = summarize(records, None, slo, client)
    shard_summaries = [r.meta.get("summary") or {} for r in runs]
    interrupted = any(r.meta.get("interrupted") for r in runs)
    summary["cancelled_in_flight"] = sum(s.get("cancelled_in_flight", 0) for s in shard_summaries)
    summary["client"]["cpu_s"] = sum(
        (s.get("client") or {}).get("cpu_s", 0.0) for s in shard_summaries
    )
    summary["connections"] = _connections(records, shard_summaries)
    summary["timestamp_source"] = client["timestamp_source"]
    caches = [r.meta.get("cache") or {} for r in runs]  # primed / flushed: every shard was
    add_cache_summaries(  # bench's prefix-cache and agent parts, from the merged records
        summary,
        records,
        _get(first, ("workload", "source")) or {},
        primed=all("primed_prefixes" in c for c in caches),
        flushed=all("flushed" in c for c in caches),
    )
    failure = None if interrupted else stopped_answering(records)
    if failure:
        summary["server_stopped_answering"] = failure
    crashes = [c for s in shard_summaries for c in s.get("worker_crashes", [])]
    if crashes:
        summary["worker_crashes"] = crashes
    if telemetry_run is not None:
        summary["telemetry"] = copy.deepcopy(telemetry_run.meta["summary"]["telemetry"])
        add_telemetry_figures(summary)
    for x in summary["client"].get("workers", []):
        x["shard"] = shard_of_worker.get(x["worker"])
    for row in rows:
        bounds = [
            x["timing_bound_s"]
            for x in summary["client"].get("workers", [])
            if x["shard"] == row["shard"] and x["timing_bound_s"] is not None
        ]
        row["timing_bound_s"] = max(bounds, default=None)
    summary["shards"] = rows
    if missing:
        summary["shards_missing"] = missing
    if conclude is not None:
        conclude(summary, records, [r.meta for r in runs])

    meta = copy.deepcopy({k: v for k, v in first.items() if k not in ("shard", "summary")})
    count = first["shard"]["count"]
    meta.update(
        name=name or first.get("name") or out.name,
        status="interrupted" if interrupted else "complete",
        command=list(command or []),
        started_at=min(r.meta.get("started_at") or "" for r in runs) or None,
        ended_at=max(r.meta.get("ended_at") or "" for r in runs) or None,
        interrupted=interrupted,
        timestamp_source=summary["timestamp_source"],
        merged={
            "start_skew": skew,  # shards started apart (with --allow-start-skew), or None
            "shards": count,
            "merged": [r["shard"] for r in rows],
            "missing": missing,
            "environments": {r.meta["shard"]["index"]: r.meta.get("environment") for r in runs},
        },
        summary=summary,
    )
    meta["load"].update(workers=offset, concurrency=first["shard"]["concurrency_total"])
    meta[RECORDS_KEY] = record_counts(records)  # what the merged requests.jsonl holds
    meta["clock"] = {
        "start_at_unix_s": first["clock"].get("start_at_unix_s"),
        "t0_unix_s": ref_t0,
        "late_start_s": max((r["late_start_s"] or 0.0 for r in rows), default=None),
        "kernel": None,  # per shard: summary.shards[i].clock
    }
    writer = RunWriter(out)
    try:
        for rec in records:
            writer.add_record(rec)
        for sample in timeseries:
            writer.add_sample(sample)
        writer.write_run(meta)
    finally:
        writer.close()
    return MergeResult(out, meta, summary, records, missing)
