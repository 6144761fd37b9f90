"""The two halves of `cbbench run`: measured (a real server per scheduler, load over HTTP)
and simulated (`cbbench sim`'s in-process replay on a modelled device)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cbbench.harness.summary import parse_slo
from rich.console import Console


def run_measured(
    args: argparse.Namespace, names: list[str], spec: str, parent: Path, console: Console
) -> tuple[list[Path], dict[str, dict], bool]:
    """One server and one bench run per scheduler. Returns the run folders, their summaries
    and whether Ctrl-C stopped the sequence (finished requests are kept either way)."""
    from cbbench.harness.cli.run import default_device, engine_flags
    from cbbench.harness.launcher import launch_reference_server
    from cbbench.harness.runner import BenchConfig, run_bench
    from cbbench.harness.telemetry import build_samplers
    from cbbench.workloads import load_workload, with_arrivals

    args.device = args.device or default_device()
    model = args.model or "tiny"
    wl = load_workload(spec, seed=args.seed, num_requests=args.num_requests)
    if args.rate is not None:
        wl = with_arrivals(wl, "poisson", rate=args.rate, seed=args.seed)
    concurrency = args.concurrency or (None if wl.open_loop else len(wl))
    slo = parse_slo(args.slo)
    telemetry = argparse.Namespace(no_gpu_metrics=not args.device.startswith("cuda"))
    dirs: list[Path] = []
    summaries: dict[str, dict] = {}
    console.print(
        f"cbbench run: {len(wl)} requests of {wl.name} against the reference engine ({model} "
        f"on {args.device}), once per scheduler: {', '.join(names)}; results in {parent}"
    )
    try:
        for i, name in enumerate(names):
            flags = engine_flags(args, name)
            console.print(f"[bold][{i + 1}/{len(names)}] {name}[/bold]: starting cbbench serve ...")
            with launch_reference_server(model, name, args.device, flags) as server:
                cfg = BenchConfig(
                    base_url=server.base_url,
                    workload=wl,
                    concurrency=concurrency,
                    slo=slo,
                    out_dir=parent / name,
                    name=name,
                    command=list(sys.argv),
                    live=not args.no_live,
                    load={"rate": args.rate, "scheduler": name, "engine_flags": flags},
                )
                console.print(f"  sending {len(wl)} requests to {server.base_url} ...")
                res = run_bench(
                    cfg, build_samplers(telemetry, server.base_url), Console(stderr=True)
                )
            dirs.append(res.run_dir)
            summaries[name] = res.summary
            s = res.summary
            console.print(
                f"  {name}: {s['counts']['completed']}/{s['counts']['total']} requests in "
                f"{s['duration_s']:.1f}s, {s['output_throughput'] or 0:.1f} output tok/s "
                f"-> {res.run_dir}"
            )
            if res.interrupted:
                console.print("[yellow]interrupted: remaining schedulers skipped[/yellow]")
                return dirs, summaries, True
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: remaining schedulers skipped[/yellow]")
        return dirs, summaries, True
    return dirs, summaries, False


# cbbench run flag dest -> cbbench sim flag, for the engine flags the simulator knows.
_SIM_FLAGS = {
    "dtype": "--dtype",
    "drain_timeout": "--drain-timeout",
    "max_batch_size": "--max-batch-size",
    "max_queue_delay": "--max-queue-delay",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "policy": "--policy",
    "max_queue_wait": "--max-queue-wait",
    "max_prefills_per_step": "--max-prefills-per-step",
    "block_size": "--block-size",
    "num_kv_blocks": "--num-kv-blocks",
    "kv_cache_memory_gb": "--kv-cache-memory-gb",
    "max_model_len": "--max-model-len",
}


def sim_argv(args: argparse.Namespace, names: list[str], spec: str, parent: Path) -> list[str]:
    from cbbench.harness.cli.run import DEFAULT_SIM_MODEL

    argv = [
        "sim",
        "--workload",
        spec,
        "--scheduler",
        ",".join(names),
        "--hardware",
        args.sim,
        "--model",
        args.model or DEFAULT_SIM_MODEL,
        "--batch-size",
        str(args.batch_size),
        "--seed",
        str(args.seed),
        "--out",
        str(parent),
    ]
    if args.num_requests:
        argv += ["--num-requests", str(args.num_requests)]
    if args.rate:
        argv += ["--rate", str(args.rate)]
    for dest, flag in _SIM_FLAGS.items():
        v = getattr(args, dest, None)
        if v is not None:
            argv += [flag, str(v)]
    if args.preferred_batch_sizes:
        argv += ["--preferred-batch-sizes", ",".join(str(b) for b in args.preferred_batch_sizes)]
    if args.enable_chunked_prefill is False:
        argv.append("--no-chunked-prefill")
    if args.enable_prefix_caching:
        argv.append("--enable-prefix-caching")
    return argv


def run_simulated(
    args: argparse.Namespace, names: list[str], spec: str, parent: Path, console: Console
) -> list[Path]:
    """`cbbench sim` with the run's flags: its SIMULATED table, one run folder per scheduler."""
    from cbbench.harness.cli import sim as cmd_sim

    p = argparse.ArgumentParser(prog="cbbench")
    cmd_sim.register(p.add_subparsers())
    ns = p.parse_args(sim_argv(args, names, spec, parent))
    console.print(
        f"cbbench run --sim {args.sim}: SIMULATED on {args.sim} "
        f"({ns.model}), no server started; results in {parent}"
    )
    cmd_sim.run(ns)
    return [parent / n for n in names]
