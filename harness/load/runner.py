"""One benchmark run: probe the server, write the run folder, drive the load (in-process or
in worker processes), telemetry samplers, live view, summary, run.json; survives Ctrl-C.

run.json is written at the start (status "running") and rewritten at the end, so even a killed
run leaves a valid one next to every request that finished.

Over 400 lines because the run's phases (probe, cache preparation, workers, telemetry,
summary, run.json) share the one try/finally that keeps every finished request on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from cbbench.harness.client import aio
from cbbench.harness.client.api import ClientConfig, probe_server
from cbbench.harness.client.endpoints import is_conversational
from cbbench.harness.client.server_info import server_identity
from cbbench.harness.conclusions.run_summary import (
    OVER_SATURATED,
    add_run_conclusions,
    conclusion_lines,
    duration_not_reached,
)
from cbbench.harness.console.live import LiveStats, LiveView, print_summary
from cbbench.harness.console.outcome import outcome_lines, worker_timing_lines
from cbbench.harness.console.window_table import window_table
from cbbench.harness.errors import CbbenchError, resource_hint
from cbbench.harness.load.cache import check_agent_endpoint, prepare_cache
from cbbench.harness.load.cache_options import CacheOptions
from cbbench.harness.load.context_fit import fit_for_server
from cbbench.harness.load.loadgen import Job, WorkerPlan, run_worker
from cbbench.harness.load.sample_clock import SampleClock
from cbbench.harness.load.sessions import CAP_UNITS
from cbbench.harness.load.shards import (
    Shard,
    clock_meta,
    deal,
    monotonic_ns_at,
    shard_meta,
    shard_share,
    share,
    split_jobs,
    unix_s_at,
)
from cbbench.harness.load.text_fit import fit_text_prompts
from cbbench.harness.load.workers import run_workers
from cbbench.harness.results.agent_summary import add_cache_summaries, cache_lines
from cbbench.harness.results.efficiency import add_telemetry_figures
from cbbench.harness.results.environment import environment
from cbbench.harness.results.integrity import RECORDS_KEY, record_counts
from cbbench.harness.results.outcome import FirstFailures, all_failed, stopped_answering
from cbbench.harness.results.records import RECORD_SCHEMA_VERSION, RequestRecord
from cbbench.harness.results.run_folder import RunWriter
from cbbench.harness.results.summary import RunSummary, summarize
from cbbench.harness.telemetry.adapters import QUEUE_TIME
from cbbench.harness.telemetry.queue_time import bound_by_records
from cbbench.harness.telemetry.server_settings import read_server_settings
from cbbench.workloads.spec import Workload
from cbbench.workloads.stats import describe_array
from rich.console import Console


@dataclass
class BenchConfig:
    base_url: str
    workload: Workload
    endpoint: str = "completions"
    model: str | None = None
    concurrency: int | None = None
    duration_s: float | None = None
    warmup: int = 0
    slo: dict = field(default_factory=dict)
    tokenizer: str | None = None
    api_key: str | None = None
    workers: int = 1
    out_dir: str | Path | None = None
    name: str | None = None
    timeout_s: float = 600.0
    stream: bool = True
    extensions: bool = True
    extra_body: dict = field(default_factory=dict)
    text_prompts: bool = False
    load: dict = field(default_factory=dict)  # load flags as given (rate, burstiness), for run.json
    command: list[str] = field(default_factory=list)
    live: bool = True
    # False: the caller judges the timing bound once over several runs (cbbench run)
    timing_warning: bool = True
    collect_server_times: bool = False
    http_client: str = "raw"
    prewarm: bool = True  # open the connections (up to the concurrency) before t0
    kernel_timestamps: bool = True  # raw client: kernel receive times where the OS gives them
    cap_unit: str = "sessions"  # sessions: what --concurrency counts (sessions | requests)
    keep_token_ids: bool = False  # sessions: prompt/reply token ids in each record's extra
    shard: Shard | None = None  # --shard I/N: send only part I of the N-way split (shards.py)
    start_at: float | None = None  # --start-at: t0 at this wall-clock time (unix seconds)
    cache: CacheOptions = field(default_factory=CacheOptions)  # --flush-cache, --prime, header
    embeddings_batch: int = 1  # --endpoint embeddings: inputs per request
    reasoning_parser: str = "auto"  # --reasoning-parser: where reasoning is in a stream
    window: str | tuple[float, float] = "steady"  # --window: the figures the summary leads with


@dataclass
class BenchResult:
    run_dir: Path
    summary: RunSummary
    interrupted: bool
    records: list[RequestRecord]
    meta: dict
    # the server stopped answering, the run stopped early or every request failed: exit 1
    failure: str | None = None


def graph_cap(cfg: BenchConfig, console: Console) -> BenchConfig:
    """An agent graph's calls run in parallel within a session: --concurrency counts calls
    in flight (said in one line), not sessions."""
    graph = any(r.graph is not None for r in cfg.workload.requests)
    if not graph or not cfg.concurrency or cfg.cap_unit != "sessions":
        return cfg
    console.print(
        f"--concurrency {cfg.concurrency} counts calls in flight: an agent graph's calls run in "
        "parallel within a session; a session starts when a call slot is free (or by the "
        "arrival process); --cap-unit does not apply",
        highlight=False,
    )
    return dataclasses.replace(cfg, cap_unit="requests")


def _now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def default_out_dir(name: str) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("results") / "runs" / f"{stamp}-{name}"


def _jobs(wl: Workload, warmup: int) -> tuple[list[Job], list[Job]]:
    def job(r, is_warmup=False):
        session = {} if is_warmup else {"session_id": r.session_id, "turn": r.turn}
        return Job(
            r.index,
            r.prompt_len,
            r.output_len,
            None if is_warmup else r.arrival_s,
            r.priority,
            tuple(r.prefix_ids),
            is_warmup,
            think_s=r.think_s,
            text=r.text,
            agent=None if is_warmup else r.agent,
            graph=None if is_warmup else r.graph,
            **session,
        )

    warm = [job(r, True) for r in wl.requests[:warmup]]
    return [job(r) for r in wl.requests], warm


def _plans(cfg: BenchConfig, client: ClientConfig) -> list[WorkerPlan]:
    jobs, warm = _jobs(cfg.workload, cfg.warmup)
    concurrency = shard_share(cfg.concurrency, cfg.shard)
    if cfg.shard is not None:  # this host's part of the N-way split, as worker I would get
        jobs = split_jobs(jobs, cfg.shard.count)[cfg.shard.index]
        warm = deal(warm, cfg.shard.count)[cfg.shard.index]
    n = min(cfg.workers, concurrency or cfg.workers)  # every worker holds >= 1 slot
    parts = split_jobs(jobs, n)  # a session stays on one worker; lone jobs round-robin
    warm_parts = deal(warm, n)
    plans = []
    for w in range(n):
        slots = share(concurrency, n, w)
        if slots is not None:  # never more slots (nor connections) than requests to hold
            slots = min(slots, max(1, len(parts[w]), len(warm_parts[w])))
        plans.append(
            WorkerPlan(
                worker=w,
                jobs=parts[w],
                warmup_jobs=warm_parts[w],
                client=client,
                concurrency=slots,
                duration_s=cfg.duration_s,
                seed=cfg.workload.prompt_seed,
                prefix_block_size=cfg.workload.prefix_block_size,
                tokenizer=cfg.tokenizer,
                text_prompts=cfg.text_prompts or is_conversational(cfg.endpoint),
                cap_unit=cfg.cap_unit,
                keep_token_ids=cfg.keep_token_ids,
                prewarm=cfg.prewarm,
            )
        )
    return plans


def connection_summary(records: list[RequestRecord], stats: list[dict]) -> dict:
    """Connection counts: the raw pools' own (opened, before t0, reused, closed by the
    server, requests sent again) and, from the measured records, how many requests had to
    open a connection and what that cost (`connect_s`, kept out of TTFT)."""
    pools = [st["connections"] for st in stats if st.get("connections")]
    keys = ("opened", "prewarmed", "reused", "closed_by_server", "retried", "user_reads")
    out: dict = {k: (sum(p.get(k, 0) for p in pools) if pools else None) for k in keys}
    measured = [r for r in records if not r.warmup]
    cold = [r.connect_s for r in measured if r.connect_s is not None]
    out["requests_on_new_connection"] = len(cold)
    out["connect_s"] = describe_array(np.asarray(cold, dtype=float))
    return out


def _run_inprocess(
    plan: WorkerPlan, on_event, stop_flag: threading.Event, start_at: float | None = None
) -> dict[int, dict]:
    async def main() -> dict[int, dict]:
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGINT, stop_flag.set)
            handled = True
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            handled = False

        async def wait_t0() -> int:
            on_event("ready", None)  # the samplers start: before t0, out of the window
            t0 = time.monotonic_ns() if start_at is None else monotonic_ns_at(start_at)
            on_event("t0", t0)
            return t0

        try:
            stats = await run_worker(plan, on_event, wait_t0, stop_flag.is_set)
        finally:
            if handled:
                loop.remove_signal_handler(signal.SIGINT)
        return {0: stats.final()}

    return aio.run(main())


WORKER_TIMING_KEYS = ("loop_lag_s", "cpu", "timestamp_source", "send_window_s", "read_delay_s")


def _run_meta(cfg: BenchConfig, name: str, engine: dict, model: str, workers: int) -> dict:
    """run.json as written at the start; the end adds status, ended_at and summary."""
    return {
        "name": name,
        "status": "running",
        "command": cfg.command,
        "record_schema_version": RECORD_SCHEMA_VERSION,
        "workload": {
            "name": cfg.workload.name,
            "seed": cfg.workload.seed,
            "num_requests": len(cfg.workload),
            "prefix_block_size": cfg.workload.prefix_block_size,
            "source": cfg.workload.source,
        },
        "target": {
            "base_url": cfg.base_url,
            "model": model,
            "endpoint": cfg.endpoint,
            "engine": engine,
        },
        "load": {
            "mode": "open" if cfg.workload.open_loop else "closed",
            "concurrency": shard_share(cfg.concurrency, cfg.shard),
            "duration_s": cfg.duration_s,
            "warmup": cfg.warmup,
            "workers": workers,
            "stream": cfg.stream,
            "timeout_s": cfg.timeout_s,
            "extensions": cfg.extensions,
            "http_client": cfg.http_client,
            "reasoning_parser": cfg.reasoning_parser,
            "prewarm": cfg.prewarm,
            "event_loop": aio.loop_name(),
            "text_prompts": cfg.text_prompts or is_conversational(cfg.endpoint),
            "cap_unit": cfg.cap_unit,
            "tokenizer": cfg.tokenizer,
            "slo_s": cfg.slo,
            **cfg.load,
        },
        "environment": environment(),
        "started_at": _now_iso(),
        "ended_at": None,
        "interrupted": False,
        "clock": clock_meta(cfg.start_at),  # t0 on the wall clock, set when t0 is
    }


def run_bench(
    cfg: BenchConfig, samplers: list | None = None, console: Console | None = None
) -> BenchResult:
    samplers = list(samplers or [])
    observers = [s for s in samplers if hasattr(s, "on_record")]  # the saturation watch: fed
    samplers = [s for s in samplers if not hasattr(s, "on_record")]  # records, not started
    out = console or Console()  # the final table: stdout
    console = console or Console(stderr=True)  # the live view: stderr
    if cfg.workers < 1:
        raise CbbenchError(f"--workers must be >= 1, got {cfg.workers}")
    if cfg.warmup < 0:
        raise CbbenchError(f"--warmup must be >= 0, got {cfg.warmup}")
    if cfg.cap_unit not in CAP_UNITS:
        raise CbbenchError(f"--cap-unit must be one of {', '.join(CAP_UNITS)}, got {cfg.cap_unit}")
    if cfg.shard is not None and cfg.concurrency is not None and cfg.concurrency < cfg.shard.count:
        raise CbbenchError(
            f"--shard {cfg.shard}: --concurrency {cfg.concurrency} leaves a shard no slot "
            f"(each of the {cfg.shard.count} shards needs >= 1)"
        )
    check_agent_endpoint(cfg.endpoint, cfg.workload)
    cfg = graph_cap(cfg, console)
    engine = probe_server(cfg.base_url, cfg.api_key)
    model = cfg.model or (engine["models"][0] if engine["models"] else None)
    if not model:
        raise CbbenchError(f"{cfg.base_url}/v1/models lists no model; pass --model")
    # requests that cannot fit the server's context: clamped or skipped (context_fit.py)
    cfg.workload, fitted = fit_for_server(
        cfg.workload, engine.get("max_model_len"), cfg.endpoint, cfg.base_url, model, cfg.api_key
    )
    name = cfg.name or cfg.workload.short_name.replace("/", "_")
    run_dir = Path(cfg.out_dir) if cfg.out_dir else default_out_dir(Path(name).name)
    if (run_dir / "requests.jsonl").exists():
        raise CbbenchError(f"{run_dir}: already holds a run; choose another --out")
    client = ClientConfig(
        base_url=cfg.base_url,
        model=model,
        endpoint=cfg.endpoint,
        stream=cfg.stream,
        api_key=cfg.api_key,
        timeout_s=cfg.timeout_s,
        extensions=cfg.extensions,
        extra_body=cfg.extra_body,
        max_connections=min(
            shard_share(cfg.concurrency, cfg.shard) or len(cfg.workload),
            max(1, len(cfg.workload), cfg.warmup),
        ),
        collect_server_times=cfg.collect_server_times,
        http_client=cfg.http_client,
        kernel_timestamps=cfg.kernel_timestamps,
        session_header=cfg.cache.session_header or None,
        reasoning_parser=cfg.reasoning_parser,
        embeddings_batch=cfg.embeddings_batch,
    )
    plans = _plans(cfg, client)
    meta = {**_run_meta(cfg, name, engine, model, len(plans)), **fit_text_prompts(cfg, plans)}
    # the batching settings the server says it runs (calibrate --from-run replays with them)
    prom = next((s.url for s in samplers if isinstance(getattr(s, "url", None), str)), None)
    server = meta["environment"]["server"] = server_identity(cfg.base_url, engine, cfg.api_key)
    asked = server.get("server_info", {}) if server.get("name") == "sglang" else None
    meta["target"]["server_settings"] = read_server_settings(  # SGLang's: asked once, above
        prom, engine, base_url=cfg.base_url, api_key=cfg.api_key, read=asked
    )
    if cfg.concurrency is not None:  # what --concurrency could hold: at most every request
        meta["load"]["max_in_flight"] = sum(p.concurrency or 0 for p in plans)
    meta["cache"] = prepare_cache(  # flush, prime (prompts built as the workers build them)
        cfg.cache, client, cfg.workload, cfg.text_prompts, cfg.tokenizer, plans[0].text_fit
    )
    if cfg.shard is not None:  # who this is and what it sends: what `cbbench merge` checks
        meta["shard"] = shard_meta(cfg.shard, cfg.workload.requests, cfg.concurrency, plans)
    writer = RunWriter(run_dir, secrets=(cfg.api_key,))
    writer.write_run(meta)
    if fitted is not None and fitted.changed:  # said, and kept in run.json
        meta["load"]["context_fit"] = fitted.to_dict()
        writer.write_run(meta)
    asked = cfg.load.get("num_requests_asked")
    if asked:
        console.print(
            f"note: --num-requests {asked}, but {cfg.workload.name} holds "
            f"{len(cfg.workload)} requests: sending {len(cfg.workload)}",
            highlight=False, markup=False, soft_wrap=True,
        )  # fmt: skip
    records: list[RequestRecord] = []
    planned = sum(len(p.jobs) for p in plans)
    live = LiveStats(planned, samplers)
    stop_flag = threading.Event()
    for s in observers:
        s.bind_stop(stop_flag.set)
    started: list = []
    first = FirstFailures(planned + sum(len(p.warmup_jobs) for p in plans))

    def on_event(kind: str, payload) -> None:
        if kind == "record":
            writer.add_record(payload)
            records.append(payload)
            if cfg.live:  # nothing reads the live figures without the view (~1.5 us a record)
                live.on_record(payload)
            for s in observers:
                s.on_record(payload)
            if first.add(payload):  # the same client error every time: stop sending
                stop_flag.set()
        elif kind == "sample":
            writer.add_sample(payload)
            live.on_sample(payload)
            for s in observers:
                s.on_sample(payload)
        elif kind == "ready":  # warmed up and connected; t0 comes next
            start_samplers()
        elif kind == "t0":
            if not started and samplers:  # stopped before "ready": started here, as before
                start_samplers()
            sample_clock.set_t0(payload)
            live.on_t0()
            clock = meta["clock"]
            clock["t0_unix_s"] = cfg.start_at if cfg.start_at is not None else unix_s_at(payload)
            clock["late_start_s"] = max(0, time.monotonic_ns() - payload) / 1e9

    sample_clock = SampleClock(writer.add_sample)

    def start_samplers() -> None:
        """Every sampler up before t0 (sample_clock.py): their start-up is not measured."""
        if started:
            return
        anchor = sample_clock.start()
        for s in samplers:
            s.start(anchor, sample_clock.add)
            started.append(s)

    worker_stats: dict[int, dict] = {}
    crash: BaseException | None = None
    try:
        with LiveView(live, console, enabled=cfg.live):
            if len(plans) == 1:
                worker_stats = _run_inprocess(plans[0], on_event, stop_flag, cfg.start_at)
            else:
                previous = signal.signal(signal.SIGINT, lambda *_: stop_flag.set())
                try:
                    worker_stats = run_workers(plans, on_event, stop_flag, cfg.start_at)
                finally:
                    signal.signal(signal.SIGINT, previous)
    except BaseException as exc:  # run.json says how the run ended, then the error goes on
        crash = exc
        raise
    finally:
        writer.flush()  # every record on disk before the watches' last read and the summary
        for s in started:
            s.stop()
        # a watch (sweep's) that stopped the run names why: stopped, not interrupted
        watched = next((s.stop_reason for s in started if getattr(s, "stop_reason", None)), None)
        # bench's saturation watch (harness/conclusions/saturation_watch.py) likewise
        saturated = next((s.found for s in observers if s.found and s.found["stopped"]), None)
        interrupted = (
            stop_flag.is_set() and first.verdict is None and watched is None and saturated is None
        )
        client_samples: dict = {"loop_lag_s": [], "cpu": []}
        for st in worker_stats.values():
            client_samples["loop_lag_s"] += st.get("loop_lag_s", [])
            client_samples["cpu"] += st.get("cpu", [])
        sources = {st.get("timestamp_source", "user") for st in worker_stats.values()}
        client_samples["timestamp_source"] = "kernel" if sources == {"kernel"} else "user"
        client_samples["workers"] = {
            w: {k: st[k] for k in WORKER_TIMING_KEYS if k in st}
            for w, st in worker_stats.items()
            if "crashed" not in st
        }
        summary = summarize(records, None, cfg.slo, client_samples)
        add_cache_summaries(
            summary, records, cfg.workload.source, cfg.cache.prime, cfg.cache.flush_cache
        )
        if "shard" in meta:  # the raw samples: `cbbench merge` recomputes this summary
            meta["shard"]["client_samples"] = client_samples
        summary["cancelled_in_flight"] = sum(st.get("cancelled", 0) for st in worker_stats.values())
        summary["client"]["cpu_s"] = sum(st.get("cpu_s", 0.0) for st in worker_stats.values())
        summary["connections"] = connection_summary(records, list(worker_stats.values()))
        summary["timestamp_source"] = client_samples["timestamp_source"]
        meta["timestamp_source"] = summary["timestamp_source"]
        failure = None if interrupted else stopped_answering(records)
        if failure:
            summary["server_stopped_answering"] = failure
        stopped_early = first.held_back(  # only when the stop held requests back
            max(0, planned - summary["counts"]["total"] - summary["cancelled_in_flight"]),
            summary["cancelled_in_flight"],
        )
        if stopped_early:
            summary["stopped_early"] = stopped_early
        if not interrupted:
            failure = failure or stopped_early or all_failed(summary)
        add_run_conclusions(summary, records, cfg.window, cfg.slo, observers)
        if not interrupted and not stopped_early and not summary.get("over_saturated"):
            short = duration_not_reached(records, cfg.duration_s, planned)
            if short:
                summary["duration_not_reached"] = short
        crashed = [st["crashed"] for st in worker_stats.values() if "crashed" in st]
        if crashed:
            summary["worker_crashes"] = crashed
        if started:
            summary["telemetry"] = {
                getattr(s, "name", type(s).__name__): s.summary() for s in started
            }
            ttft = summary["ttft_s"] if cfg.stream else summary["e2e_s"]
            for t in summary["telemetry"].values():
                if isinstance(t, dict) and isinstance(t.get(QUEUE_TIME), dict):
                    t[QUEUE_TIME] = bound_by_records(t[QUEUE_TIME], ttft)
            add_telemetry_figures(summary)
        scheduler = next((r.extra["scheduler"] for r in records if "scheduler" in r.extra), None)
        if scheduler:
            meta["target"]["scheduler"] = scheduler
        meta[RECORDS_KEY] = record_counts(records)  # what requests.jsonl holds (integrity.py)
        status = "interrupted" if interrupted else "complete"
        if crash is not None and not isinstance(crash, KeyboardInterrupt):
            status, meta["error"] = "failed", f"{crash}{resource_hint(crash)}"
        elif saturated:
            status = OVER_SATURATED
        elif watched:
            status, summary["stopped_by_watch"] = "stopped-early", watched
        elif stopped_early and not interrupted:  # the same client error: requests held back
            status = "stopped-early"
        elif not interrupted and not summary["counts"]["total"]:
            status = "empty"  # nothing measured: never "complete" with 0 records
            failure = failure or "no measured request finished: nothing was sent"
        meta.update(
            status=status,
            ended_at=_now_iso(),
            interrupted=interrupted,
            summary=summary,
        )
        writer.write_run(meta)
        writer.close()
    print_summary(out, summary, f"cbbench bench: {name}")
    windowed = window_table(summary)  # the steady window beside the whole run
    if windowed is not None:
        out.print(windowed)
    for line in [*worker_timing_lines(summary), *cache_lines(summary)]:
        if cfg.timing_warning or not line.startswith("TIMING BOUND"):
            out.print(line, highlight=False, soft_wrap=True)  # whole lines, not cut mid-phrase
    if fitted is not None and fitted.changed:
        out.print(f"note: {fitted.line()}", highlight=False, markup=False, soft_wrap=True)
    for line in outcome_lines(summary, interrupted=interrupted, planned=planned, stopped=watched):
        out.print(line, highlight=False, markup=False, soft_wrap=True)
    for line in conclusion_lines(summary, window_table=windowed is not None):
        out.print(line, highlight=False, markup=False, soft_wrap=True)
    out.print(f"run folder: {run_dir}")
    return BenchResult(run_dir, summary, interrupted, records, meta, failure)
