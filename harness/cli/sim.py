"""`cbbench sim`: the reference engine's schedulers on a workload, in simulated time.

The one place the harness runs the engine in-process: its SimExecutor advances a virtual clock
by a modelled step time (reference_engine/cost_model.py), so every number is SIMULATED and
labelled so, on screen and in run.json (`"simulated": true`). `--executor real` replays the
same workload through the real model instead (offline, in-process, wall clock): MEASURED.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from cbbench.harness.errors import CbbenchError
from cbbench.harness.records import RequestRecord
from cbbench.harness.results import RunWriter
from cbbench.harness.summary import summarize
from cbbench.reference_engine.block_manager import cdiv
from cbbench.reference_engine.config import (
    SCHEDULERS,
    ContinuousConfig,
    DynamicConfig,
    EngineConfig,
    StaticConfig,
)
from cbbench.reference_engine.cost_model import CostModel, get_hardware
from cbbench.reference_engine.engine import resolve_model_config
from cbbench.reference_engine.simulate import SimResult, replay, replay_interleaved
from cbbench.workloads import load_workload, with_arrivals
from rich.console import Console
from rich.table import Table

TIMESERIES_MAX_SAMPLES = 5000
LABELS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sim",
        help="compare static / dynamic / continuous batching in simulated time",
        description="Run the reference engine's schedulers over a workload with a simulated "
        "executor (modelled step times on the chosen hardware). Output is SIMULATED.",
    )
    p.add_argument("--scheduler", default="static,dynamic,continuous", help="comma list")
    p.add_argument("--workload", default="mixed", help="preset name, trace path or spec file")
    p.add_argument(
        "--seed", type=int, default=None, help="workload seed (default: the spec file's, else 0)"
    )
    p.add_argument("--num-requests", type=int, default=None)
    p.add_argument("--rate", type=float, default=None, help="Poisson arrivals at R req/s")
    p.add_argument(
        "--drop-too-long",
        action="store_true",
        help="skip requests whose prompt + output exceed max_model_len (counted on screen)",
    )
    p.add_argument("--model", default="llama-3-8b", help="model preset or HF folder (shape)")
    p.add_argument("--dtype", default="auto", help="auto = the model's dtype")
    p.add_argument(
        "--hardware",
        default="h100",
        help="a100-80g, h100-sxm (h100), h200, cpu-measured, steps (1 unit per step), "
        "or a JSON from `cbbench calibrate`",
    )
    p.add_argument("--batch-size", type=int, default=32, help="B: static batch size, and the "
                   "default dynamic max batch size and continuous max_num_seqs")  # fmt: skip
    g = p.add_argument_group("static")
    g.add_argument("--drain-timeout", type=float, default=1.0, help="seconds")
    g = p.add_argument_group("dynamic")
    g.add_argument("--max-batch-size", type=int, default=None)
    g.add_argument("--preferred-batch-sizes", default="", help="comma list")
    g.add_argument("--max-queue-delay", type=float, default=0.01, help="seconds")
    g.add_argument("--max-queue-size", type=int, default=None)
    g = p.add_argument_group("continuous")
    g.add_argument("--max-num-seqs", type=int, default=None)
    g.add_argument("--max-num-batched-tokens", type=int, default=None)
    g.add_argument("--no-chunked-prefill", action="store_true")
    g.add_argument("--policy", default="fcfs", choices=["fcfs", "priority"])
    g.add_argument("--aging-rate", type=float, default=1.0, help="priority levels per second")
    g.add_argument("--max-queue-wait", type=float, default=None, help="seconds")
    g.add_argument("--max-prefills-per-step", type=int, default=None)
    g = p.add_argument_group("KV cache")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--num-kv-blocks", type=int, default=None)
    g.add_argument("--kv-cache-memory-gb", type=float, default=None)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--enable-prefix-caching", action="store_true")
    p.add_argument(
        "--executor",
        default="sim",
        choices=["sim", "real"],
        help="sim: modelled step times (SIMULATED); real: the model on --device, offline "
        "in-process, wall clock (MEASURED, no HTTP)",
    )
    p.add_argument("--device", default="cpu", help="--executor real only")
    p.add_argument("--timeline", action="store_true", help="print the step-by-step slot timeline")
    p.add_argument("--out", default=None, help="write one run folder per scheduler under DIR")
    p.set_defaults(func=run)


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise CbbenchError(f"{flag}: expected a comma list of integers, got {text!r}") from None


def engine_config(args: argparse.Namespace, scheduler: str) -> EngineConfig:
    b = args.batch_size
    return EngineConfig(
        model=args.model,
        dtype=args.dtype,
        scheduler=scheduler,
        executor=args.executor,
        device=args.device,
        hardware=args.hardware,
        static=StaticConfig(batch_size=b, drain_timeout_s=args.drain_timeout),
        dynamic=DynamicConfig(
            max_batch_size=args.max_batch_size or b,
            preferred_batch_sizes=_ints(args.preferred_batch_sizes, "--preferred-batch-sizes"),
            max_queue_delay_s=args.max_queue_delay,
            max_queue_size=args.max_queue_size,
        ),
        continuous=ContinuousConfig(
            max_num_seqs=args.max_num_seqs or b,
            max_num_batched_tokens=args.max_num_batched_tokens or max(8192, args.max_num_seqs or b),
            enable_chunked_prefill=not args.no_chunked_prefill,
            policy=args.policy,
            aging_rate=args.aging_rate,
            max_queue_wait_s=args.max_queue_wait,
            max_prefills_per_step=args.max_prefills_per_step,
        ),
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        kv_cache_memory_gb=args.kv_cache_memory_gb,
        max_model_len=args.max_model_len,
        enable_prefix_caching=args.enable_prefix_caching,
        seed=args.seed,
    )


def fit_static_batch(cfg: EngineConfig, console: Console) -> EngineConfig:
    """Static batching reserves max_model_len per slot: shrink B to what the KV pool holds
    (what a static server must do) and say so, rather than fail."""
    mc = resolve_model_config(cfg.model)
    dtype = mc.torch_dtype if cfg.dtype == "auto" else cfg.dtype
    cost = CostModel(mc, get_hardware(cfg.hardware), dtype)
    blocks = cfg.num_kv_blocks or (
        int(cfg.kv_cache_memory_gb * 1e9 // (cost.kv_bytes_per_token * cfg.block_size))
        if cfg.kv_cache_memory_gb
        else cost.kv_pool_blocks(cfg.block_size)
    )
    max_len = cfg.max_model_len or mc.max_position_embeddings
    fits = blocks // cdiv(max_len, cfg.block_size)
    if fits >= cfg.static.batch_size:
        return cfg
    if fits < 1:
        raise CbbenchError(
            f"static batching: one slot of max_model_len {max_len} needs more KV than the pool "
            f"holds ({blocks} blocks of {cfg.block_size}); lower --max-model-len"
        )
    console.print(
        f"[yellow]static: batch size {cfg.static.batch_size} -> {fits}: KV for max_model_len "
        f"({max_len}) per slot only fits {fits} slots in {blocks} blocks[/yellow]"
    )
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
                token_times_s=list(r.token_times_s),
                ttft_s=r.ttft_s,
                tpot_s=r.tpot_s,
                e2e_s=r.e2e_s,
                itl_s=itl,
                server_queue_s=r.queue_s,
                prompt_tokens_server=r.prompt_len,
                output_tokens_server=len(r.token_times_s),
                finish_reason=r.finish_reason,
                extra={
                    "simulated": res.simulated,
                    "scheduler": scheduler,
                    "num_preemptions": r.num_preemptions,
                    "num_cached_tokens": r.num_cached_tokens,
                },
            )
        )
    return out


def write_run(out: Path, scheduler: str, res: SimResult, args, workload, argv) -> Path:
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
                    "waiting": s.num_waiting,
                    "kv_usage": s.kv_blocks_used / res.num_kv_blocks,
                    "batch_occupancy": s.batch_occupancy,
                    "kv_reserved_unused_tokens": s.kv_reserved_unused_tokens,
                    "num_batched_tokens": s.num_batched_tokens,
                    "step_time_s": s.end_s - s.start_s,
                }
            )
        summary = summarize(records, duration_s=res.duration_s)
        summary["sim"] = res.summary()
        writer.write_run(
            {
                "name": f"{'sim' if res.simulated else 'offline'}-{scheduler}",
                "simulated": res.simulated,
                "command": argv,
                "scheduler": scheduler,
                "hardware": res.hardware,
                "model": args.model,
                "workload": {
                    "name": args.workload,
                    "seed": args.seed,
                    "num_requests": len(workload),
                },
                "seed": args.seed,
                "load": {"rate": args.rate} if args.rate else {"concurrency": "all-at-once"},
                "engine_config": dataclasses.asdict(res.config),
                "num_kv_blocks": res.num_kv_blocks,
                "max_model_len": res.max_model_len,
                "summary": summary,
            }
        )
    finally:
        writer.close()
    return d


def _ms(d: dict, key: str) -> str:
    v = d.get(key)
    return "-" if v is None else f"{v * 1e3:,.1f}" if v < 10 else f"{v * 1e3:,.0f}"


def comparison_table(results: dict[str, SimResult], title: str, steps_mode: bool) -> Table:
    t = Table(title=title, title_style="bold yellow")
    simulated = all(r.simulated for r in results.values())
    t.add_column(f"metric ({'SIMULATED' if simulated else 'MEASURED, offline'})")
    for name in results:
        t.add_column(name, justify="right")
    sums = {k: r.summary() for k, r in results.items()}
    base = sums.get("static")
    unit = "steps" if steps_mode else "s"

    def row(label: str, fn) -> None:
        t.add_row(label, *[fn(s) for s in sums.values()])

    def f(v, fmt="{:.2f}") -> str:
        return "-" if v is None else fmt.format(v)

    row("requests", lambda s: str(s["num_requests"]))
    row("engine steps", lambda s: str(s["num_steps"]))
    row(f"duration ({unit})", lambda s: f(s["duration_s"]))
    row(f"throughput (req/{unit})", lambda s: f(s["request_throughput"], "{:.3f}"))
    row(f"throughput (output tok/{unit})", lambda s: f(s["output_throughput"], "{:.1f}"))
    if base and base["output_throughput"]:
        row(
            "throughput vs static",
            lambda s: f(s["output_throughput"] / base["output_throughput"], "{:.2f}x"),
        )
    lat = (lambda d, k: f(d.get(k))) if steps_mode else _ms
    lu = unit if steps_mode else "ms"
    for key, label in (
        ("ttft_s", "TTFT"),
        ("tpot_s", "TPOT"),
        ("e2e_s", "E2E"),
        ("queue_s", "queue"),
    ):
        for p in ("p50", "p99"):
            row(f"{label} {p} ({lu})", lambda s, key=key, p=p: lat(s[key], p))
    row("batch occupancy (mean)", lambda s: f(s["batch_occupancy_mean"], "{:.0%}"))
    row(
        "KV usage mean / max",
        lambda s: f"{f(s['kv_usage_mean'], '{:.0%}')} / {f(s['kv_usage_max'], '{:.0%}')}",
    )
    row(
        "KV reserved, unused (tokens, mean)",
        lambda s: f(s["kv_reserved_unused_tokens_mean"], "{:.0f}"),
    )
    row("preemptions", lambda s: str(s["num_preemptions"]))
    row("prompt tokens from prefix cache", lambda s: f(s["prefix_cache_hit_rate"], "{:.0%}"))
    return t


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


def run_real_interleaved(args, console: Console, names, wl, where: str, timeline: bool) -> int:
    """--executor real: one engine per scheduler, stepped in turn, each on a clock that counts
    only its own measured step times (fair on a machine whose load drifts)."""
    cfgs = [engine_config(args, n) for n in names]
    t0 = time.perf_counter()
    with console.status(
        f"running {', '.join(names)} interleaved on {where} ({len(wl)} requests)..."
    ):
        res = replay_interleaved(
            wl.requests, cfgs, prefix_block_size=wl.prefix_block_size, timeline=timeline
        )
    console.print(f"{len(names)} engines run interleaved in {time.perf_counter() - t0:.1f}s wall")
    results = dict(zip(names, res, strict=True))
    for name, r in results.items():
        tput = r.summary()["output_throughput"] or 0.0
        console.print(f"{name}: {len(r.steps)} steps run; {tput:.1f} output tok/s")
        if args.out:
            console.print(f"  run folder: {write_run(Path(args.out), name, r, args, wl, sys.argv)}")
    title = (
        f"MEASURED: {args.model} on {where}, workload {args.workload} ({len(wl)} requests, "
        f"seed {args.seed}), B={args.batch_size} — offline in-process, no HTTP; engines stepped "
        f"in turn, each clock = its own measured step times"
    )
    console.print(comparison_table(results, title, False))
    if timeline:
        console.print("[bold yellow]MEASURED timeline[/bold yellow] (one column per engine step)")
        for name, r in results.items():
            print_timeline(console, name, r)
    return 0


def run(args: argparse.Namespace) -> int:
    console = Console()
    names = [s.strip() for s in args.scheduler.split(",") if s.strip()]
    bad = [s for s in names if s not in SCHEDULERS]
    if bad or not names:
        raise CbbenchError(
            f"--scheduler: unknown {bad or names} (choose from {', '.join(SCHEDULERS)})"
        )
    if args.batch_size < 1:
        raise CbbenchError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.num_requests is not None and args.num_requests < 1:
        raise CbbenchError(f"--num-requests must be >= 1, got {args.num_requests}")
    wl = load_workload(args.workload, seed=args.seed, num_requests=args.num_requests)
    args.seed = wl.seed  # a spec file's own seed when --seed was not given
    if args.rate is not None:
        wl = with_arrivals(wl, "poisson", rate=args.rate, seed=args.seed)
    if args.drop_too_long:
        limit = args.max_model_len or resolve_model_config(args.model).max_position_embeddings
        kept = tuple(r for r in wl.requests if r.prompt_len + r.output_len <= limit)
        console.print(
            f"--drop-too-long: skipped {len(wl) - len(kept)} of {len(wl)} requests longer "
            f"than max_model_len {limit}"
        )
        if not kept:
            raise CbbenchError(f"every request of {args.workload} exceeds max_model_len {limit}")
        wl = dataclasses.replace(wl, requests=kept)
    real = args.executor == "real"
    hw = get_hardware(args.hardware)
    steps_mode = hw.steps and not real
    where = f"{args.device} (real model)" if real else hw.name
    timeline = args.timeline or (
        args.workload == "seed-demo" and args.batch_size == 4 and steps_mode
    )
    results: dict[str, SimResult] = {}
    if real:
        return run_real_interleaved(args, console, names, wl, where, timeline)
    for name in names:
        cfg = engine_config(args, name)
        if name == "static" and not real:
            cfg = fit_static_batch(cfg, console)
        t0 = time.perf_counter()
        verb = "running" if real else "simulating"
        with console.status(f"{verb} {name} on {where} ({len(wl)} requests)..."):
            results[name] = replay(
                wl.requests, cfg, prefix_block_size=wl.prefix_block_size, timeline=timeline
            )
        wall = time.perf_counter() - t0
        tput = results[name].summary()["output_throughput"] or 0.0
        console.print(
            f"{name}: {len(results[name].steps)} steps {'run' if real else 'simulated'} in "
            f"{wall:.1f}s wall; {tput:.1f} output tok/{'step' if steps_mode else 's'}"
        )
        if args.out:
            d = write_run(Path(args.out), name, results[name], args, wl, sys.argv)
            console.print(f"  run folder: {d}")
    title = (
        f"{'MEASURED' if real else 'SIMULATED'}: {args.model} on {where}, workload "
        f"{args.workload} ({len(wl)} requests, seed {args.seed}), B={args.batch_size}"
        + (
            " — offline in-process replay, wall clock, no HTTP"
            if real
            else " — 1 time unit per step"
            if steps_mode
            else " — modelled step times, not measurements"
        )
    )
    console.print(comparison_table(results, title, steps_mode))
    if timeline:
        label = "MEASURED" if real else "SIMULATED"
        console.print(f"[bold yellow]{label} timeline[/bold yellow] (one column per engine step)")
        for name, res in results.items():
            print_timeline(console, name, res)
    return 0
