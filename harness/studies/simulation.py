"""The reference engine's schedulers on one workload, in simulated (or offline real) time.

`simulate(options)` replays a workload through one engine per scheduler: with the SimExecutor
every number is SIMULATED (a virtual clock advanced by reference_engine/execution/cost_model.py) and
labelled so, on screen and in run.json (`"simulated": true`); `executor="real"` replays it
through the real model instead (offline, in-process, wall clock): MEASURED.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cbbench.harness.console.progress import request_progress
from cbbench.harness.errors import CbbenchError
from cbbench.harness.results import compare
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.run_folder import RunWriter
from cbbench.harness.results.summary import RunSummary, summarize
from cbbench.harness.studies.sim_batch import batch_label
from cbbench.harness.studies.sim_graphs import drop_too_long, graph_part, print_graph
from cbbench.harness.studies.sim_notes import print_extrapolation, print_interval, print_no_range
from cbbench.reference_engine.config.engine_config import SCHEDULERS, EngineConfig
from cbbench.reference_engine.config.options import FLAGS, SIM_DEFAULTS, build_engine_config
from cbbench.reference_engine.core.block_manager import cdiv
from cbbench.reference_engine.engine.llm_engine import resolve_model_config, sim_num_kv_blocks
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.cost_model import CostModel, get_hardware
from cbbench.reference_engine.execution.step_jitter import describe_spec as describe_jitter
from cbbench.reference_engine.sim import request_overhead as ro
from cbbench.reference_engine.sim.simulate import SimResult, replay, replay_interleaved
from cbbench.workloads import load_workload, with_arrivals
from cbbench.workloads.presets import preset_settings
from cbbench.workloads.spec import Workload
from rich.console import Console
from rich.table import Table

TIMESERIES_MAX_SAMPLES = 5000
LABELS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


@dataclass
class SimOptions:
    """One `cbbench sim` comparison."""

    workload: str = "mixed"
    schedulers: list[str] = field(default_factory=lambda: list(SCHEDULERS))
    engine: dict[str, Any] = field(default_factory=dict)  # engine settings given (flag dests)
    engine_defaults: dict[str, Any] = field(default_factory=lambda: dict(SIM_DEFAULTS))
    seed: int | None = None  # workload (and engine) seed; None: the spec's own, else 0
    num_requests: int | None = None
    rate: float | None = None  # Poisson arrivals at this rate (req/s)
    drop_too_long: bool = False
    timeline: bool = False
    temperature: float = 1.0  # of every request; 0 = greedy
    out: Path | None = None  # one run folder per scheduler under it
    command: list[str] = field(default_factory=list)  # argv, for run.json


@dataclass
class SimStudy:
    options: SimOptions
    workload: Workload
    settings: dict[str, Any]  # engine settings in effect (given > preset > defaults)
    results: dict[str, SimResult]
    run_dirs: list[Path]
    title: str
    steps_mode: bool
    timeline: bool
    extrapolated: dict[str, dict] = field(default_factory=dict)  # engine -> beyond the fit


def fit_static_batch(cfg: EngineConfig, console: Console) -> EngineConfig:
    """Static batching reserves max_model_len per slot: shrink B to what the KV pool holds
    (what a static server must do) and say so, rather than fail."""
    mc = resolve_model_config(cfg.model, shape_only=True)
    dtype = mc.torch_dtype if cfg.dtype == "auto" else cfg.dtype
    cost = CostModel(mc, get_hardware(cfg.hardware), dtype, kv_cache_dtype=cfg.kv_cache_dtype,
                     tensor_parallel=cfg.tensor_parallel_size)  # fmt: skip
    blocks = sim_num_kv_blocks(cfg, cost)
    max_len = cfg.max_model_len or mc.max_position_embeddings
    fits = blocks // cdiv(max_len, cfg.block_size)
    if fits >= cfg.static.batch_size:
        return cfg
    if fits < 1:
        raise CbbenchError(
            f"static batching: one slot of max_model_len {max_len} needs more KV than the pool "
            f"holds ({blocks} blocks of {cfg.block_size}); lower --max-model-len"
        )
    console.print(f"[yellow]static: batch size {cfg.static.batch_size} -> {fits}: KV for "
                  f"max_model_len ({max_len}) per slot only fits {fits} slots in {blocks} "
                  "blocks[/yellow]")  # fmt: skip
    return dataclasses.replace(cfg, static=dataclasses.replace(cfg.static, batch_size=fits))


def to_records(res: SimResult, scheduler: str) -> list[RequestRecord]:
    out = []
    for r in res.requests:
        itl = [b - a for a, b in zip(r.token_times_s, r.token_times_s[1:], strict=False)]
        out.append(
            RequestRecord(
                id=r.request_id,
                index=r.index,
                prompt_len=r.prompt_len,
                output_len=r.output_len,
                priority=r.priority,
                scheduled_s=r.arrival_s,
                ready_s=r.arrival_s,
                sent_s=r.arrival_s,
                first_token_s=r.first_token_s,
                last_token_s=r.finished_s,
                end_s=r.finished_s,
                token_times_s=list(r.token_times_s),
                ttft_s=r.ttft_s,
                tpot_s=r.tpot_s,
                e2e_s=r.e2e_s,
                itl_s=itl,
                server_queue_s=r.queue_s,
                prompt_tokens_server=r.prompt_len,
                output_tokens_server=len(r.token_times_s),
                finish_reason=r.finish_reason,
                session_id=r.session_id,
                extra={
                    "simulated": res.simulated,
                    "scheduler": scheduler,
                    "num_preemptions": r.num_preemptions,
                    "num_cached_tokens": r.num_cached_tokens,
                    **({"graph": dict(r.graph)} if r.graph is not None else {}),
                },
            )
        )
    return out


def write_run(
    out: Path,
    scheduler: str,
    res: SimResult,
    workload: Workload,
    *,
    workload_name: str,
    rate: float | None = None,
    command: list[str] | None = None,
    extrapolated: dict | None = None,
) -> Path:
    """One run folder (run.json, requests.jsonl, timeseries) for one replay; `extrapolated`:
    the settings beyond the hardware fit's measured steps (planning/extrapolation.py)."""
    d = out / scheduler
    writer = RunWriter(d)
    try:
        records = to_records(res, scheduler)
        for rec in records:
            writer.add_record(rec)
        stride = max(1, len(res.steps) // TIMESERIES_MAX_SAMPLES)
        for s in res.steps[::stride]:
            writer.add_sample(
                {
                    "source": "sim" if res.simulated else "engine",
                    "t_s": s.end_s,
                    "running": s.num_running,
                    "num_seqs_limit": s.num_seqs_limit,
                    "waiting": s.num_waiting,
                    "kv_usage": s.kv_blocks_used / res.num_kv_blocks,
                    "batch_occupancy": s.batch_occupancy,
                    "kv_reserved_unused_tokens": s.kv_reserved_unused_tokens,
                    "num_batched_tokens": s.num_batched_tokens,
                    "step_time_s": s.end_s - s.start_s,
                }
            )
        summary = run_summary(res, scheduler, records)
        writer.write_run(
            {
                "name": f"{'sim' if res.simulated else 'offline'}-{scheduler}",
                "simulated": res.simulated,
                "command": list(command or []),
                "scheduler": scheduler,
                "hardware": res.hardware,
                "model": res.config.model,
                "workload": {
                    "name": workload_name,
                    "seed": workload.seed,
                    "num_requests": len(workload),
                },
                "seed": workload.seed,
                "load": {"rate": rate} if rate else {"concurrency": "all-at-once"},
                "engine_config": dataclasses.asdict(res.config),
                "num_kv_blocks": res.num_kv_blocks,
                "max_model_len": res.max_model_len,
                "summary": summary,
                **({"extrapolated": extrapolated} if extrapolated else {}),
            }
        )
    finally:
        writer.close()
    return d


def run_summary(
    res: SimResult, scheduler: str, records: list[RequestRecord] | None = None
) -> RunSummary:
    """The one run summary (`summary.summarize`) of a replay, with its step statistics
    (`SimResult.summary()`) under "sim": what run.json holds and the table shows."""
    records = to_records(res, scheduler) if records is None else records
    summary = summarize(records, duration_s=res.duration_s)
    summary["sim"] = res.summary()
    graphs = graph_part(records, res.simulated)  # agent-graph sessions, replayed as graphs
    if graphs is not None:
        summary["graph"] = graphs
    return summary


def comparison_table(results: dict[str, SimResult], title: str, steps_mode: bool) -> Table:
    simulated = all(r.simulated for r in results.values())
    label = f"metric ({'SIMULATED' if simulated else 'MEASURED, offline'})"
    summaries = {name: run_summary(r, name) for name, r in results.items()}
    return compare.comparison_table(summaries, title, steps=steps_mode, label=label)


def print_timeline(console: Console, name: str, res: SimResult) -> None:
    """One row per batch slot, one column per step: the request computed there, `.` for a
    slot held by a finished request (static/dynamic waste), blank for a free slot."""
    label = {r.request_id: LABELS[i % len(LABELS)] for i, r in enumerate(res.requests)}
    n_slots = res.config.max_batch_slots
    console.print(f"[bold]{name}[/bold]: {len(res.steps)} steps")
    header = "".join(str((i + 1) % 10) for i in range(len(res.steps)))
    console.print(f"  step    {header}", highlight=False)
    for slot in range(n_slots):
        cells = []
        for s in res.steps:
            assert s.slots is not None and s.held is not None
            rid, held = s.slots[slot], s.held[slot]
            cells.append(label[rid] if rid else ("." if held else " "))
        console.print(f"  slot {slot:<2} {''.join(cells)}", highlight=False)
    waiting = "".join(str(min(s.num_waiting, 9)) for s in res.steps)
    console.print(f"  waiting {waiting}", highlight=False)


def load_sim_workload(opts: SimOptions, console: Console) -> Workload:
    """The workload, with --rate arrivals and --drop-too-long applied."""
    if opts.num_requests is not None and opts.num_requests < 1:
        raise CbbenchError(f"--num-requests must be >= 1, got {opts.num_requests}")
    wl = load_workload(opts.workload, seed=opts.seed, num_requests=opts.num_requests)
    if not wl.requests:  # else a table of dashes, exit 0
        raise CbbenchError(f"--workload {opts.workload}: no requests")
    if opts.rate is not None:
        wl = with_arrivals(wl, "poisson", rate=opts.rate, seed=wl.seed)
    if opts.drop_too_long:
        settings = {**opts.engine_defaults, **opts.engine}
        limit = settings.get("max_model_len") or resolve_model_config(
            settings.get("model", "tiny"), True).max_position_embeddings  # fmt: skip
        wl = drop_too_long(wl, limit, console, opts.workload)
    return wl


def _replay(
    wl: Workload, cfg: EngineConfig, timeline: bool, temperature: float = 1.0, on_progress=None
) -> SimResult:
    over = ro.overhead_of(get_hardware(cfg.hardware)) if cfg.executor == "sim" else {}
    try:  # a from-run fit's time outside the steps: as calibrate --check-run applies it
        return ro.with_overhead(wl.requests, over, lambda reqs: replay(
            reqs, cfg, prefix_block_size=wl.prefix_block_size, seed=wl.prompt_seed,
            timeline=timeline, temperature=temperature, on_progress=on_progress,
        ))  # fmt: skip
    except EngineError as exc:
        if "workload request" in str(exc):
            raise CbbenchError(f"{exc} (--drop-too-long skips such requests)") from None
        raise


SPEC_DESTS = tuple(d for d, f in FLAGS.items() if f.section == "speculative")
SPEC_NAME = "continuous+spec"


def engine_configs(
    given: dict[str, Any], opts: SimOptions, defaults: dict[str, Any] | None = None
) -> dict[str, EngineConfig]:
    """One config per scheduler. With a speculative method given, speculation applies to
    the continuous scheduler only, and runs beside plain continuous batching
    ("continuous+spec" next to "continuous"): the side-by-side comparison on one workload."""
    defaults = opts.engine_defaults if defaults is None else defaults
    spec = given.get("speculative_method") is not None
    plain = {k: v for k, v in given.items() if k not in SPEC_DESTS}
    cfgs: dict[str, EngineConfig] = {}
    for n in opts.schedulers:
        cfgs[n] = build_engine_config(plain, defaults, scheduler=n)
        if spec and n == "continuous":
            cfgs[SPEC_NAME] = build_engine_config(given, defaults, scheduler=n)
    if spec and SPEC_NAME not in cfgs:
        raise CbbenchError(
            "speculative decoding runs with the continuous scheduler only: add it to --scheduler"
        )
    return cfgs


def simulate(opts: SimOptions, console: Console | None = None) -> SimStudy:
    """Replay the workload once per scheduler; write run folders when `opts.out` is set."""
    console = console or Console(soft_wrap=True)
    wl = load_sim_workload(opts, console)
    # flags given > the preset's own settings (seed-demo: B = 4, hardware steps) > defaults
    defaults = {**opts.engine_defaults, **preset_settings(opts.workload)}
    settings: Mapping[str, Any] = {**defaults, **opts.engine, "seed": wl.seed}
    given = {**opts.engine, "seed": wl.seed}
    cfgs = engine_configs(given, opts, defaults)
    any_cfg = next(iter(cfgs.values()))
    real = any_cfg.executor == "real"
    hw = get_hardware(any_cfg.hardware)
    steps_mode = hw.steps and not real
    where = f"{any_cfg.device} (real model)" if real else hw.name
    b = batch_label(cfgs)
    timeline = opts.timeline or (opts.workload == "seed-demo" and b == 4 and steps_mode)
    run_dirs: list[Path] = []
    for line in () if real else (ro.describe(ro.overhead_of(hw)), describe_jitter(hw)):
        if line:  # a from-run fit's request overhead and step jitter
            console.print(line, highlight=False, soft_wrap=True)

    extrapolated: dict[str, dict] = {}  # engine -> extrapolation.outside (the fit's range)

    def save(name: str, res: SimResult) -> None:
        if opts.out is not None:
            d = write_run(
                opts.out, name, res, wl, workload_name=opts.workload, rate=opts.rate,
                command=opts.command, extrapolated=extrapolated.get(name),
            )  # fmt: skip
            run_dirs.append(d)
            console.print(f"  run folder: {d}")

    results: dict[str, SimResult] = {}
    if real:
        t0 = time.perf_counter()
        console.print(f"running {', '.join(cfgs)} interleaved on {where} ({len(wl)} requests each)")
        with request_progress(console, "all engines", len(wl) * len(cfgs)) as upd:
            res = replay_interleaved(
                wl.requests, list(cfgs.values()), prefix_block_size=wl.prefix_block_size,
                seed=wl.prompt_seed, timeline=timeline, temperature=opts.temperature, on_progress=upd,
            )  # fmt: skip
        console.print(
            f"{len(cfgs)} engines run interleaved in {time.perf_counter() - t0:.1f}s wall"
        )
        results = dict(zip(cfgs, res, strict=True))
        for name, r in results.items():
            tput = r.summary()["output_throughput"] or 0.0
            console.print(f"{name}: {len(r.steps)} steps run; {tput:.1f} output tok/s")
            print_graph(console, name, run_summary(r, name), r.simulated)
            save(name, r)
        title = (
            f"MEASURED: {any_cfg.model} on {where}, workload {opts.workload} ({len(wl)} "
            f"requests, seed {wl.seed}), B={b} — offline in-process, no HTTP; engines stepped "
            f"in turn, each clock = its own measured step times"
        )
    else:
        print_no_range(console, hw)
        for name, cfg in cfgs.items():
            if name == "static":
                cfg = fit_static_batch(cfg, console)
            t0 = time.perf_counter()
            with request_progress(console, f"simulating {name} on {where}", len(wl)) as upd:
                results[name] = _replay(wl, cfg, timeline, opts.temperature, upd)
            wall = time.perf_counter() - t0
            tput = results[name].summary()["output_throughput"] or 0.0
            console.print(
                f"{name}: {len(results[name].steps)} steps simulated in {wall:.1f}s wall; "
                f"{tput:.1f} output tok/{'step' if steps_mode else 's'}"
            )
            print_interval(console, name, hw, results[name])
            if ext := print_extrapolation(console, name, cfg, hw):  # as `plan` marks its choice
                extrapolated[name] = ext
            print_graph(console, name, run_summary(results[name], name), True)
            save(name, results[name])
        title = (f"SIMULATED: {any_cfg.model} on {where}, workload {opts.workload} ({len(wl)} "
                 f"requests, seed {wl.seed}), B={b}" + (" — 1 time unit per step" if steps_mode
                 else " — modelled step times, not measurements"))  # fmt: skip
    return SimStudy(opts, wl, dict(settings), results, run_dirs, title, steps_mode, timeline,
                    extrapolated)  # fmt: skip


def print_study(study: SimStudy, console: Console) -> None:
    """The comparison table, then the timelines when asked for."""
    table = comparison_table(study.results, study.title, study.steps_mode)
    path = compare.emit_table(console, table, study.options.out)
    if path is not None:
        console.print(f"table: {path}")
    if study.timeline:
        real = not all(r.simulated for r in study.results.values())
        label = "MEASURED" if real else "SIMULATED"
        console.print(f"[bold yellow]{label} timeline[/bold yellow] (one column per engine step)")
        for name, res in study.results.items():
            print_timeline(console, name, res)
