"""`cbbench reproduce`: the seeds' figures, regenerated with the reference engine.

1. The seed-demo timeline: outputs [10, 5, 8, 3, 12, 6], B = 4, one time unit per step
   (seeds: static 22 steps, continuous fewer, no slot idle while requests wait).
2. The seed's gains table, static -> continuous in sustained req/s, for uniform, mixed
   (outputs 10-1000) and highly mixed (1-4000) lengths (seed: 1x, 2.38x, 5.67x):
   - SIMULATED: llama-3-8b on a modelled H100, all requests at t=0, throughput over the
     steady window; --replicates independent request sets (workload seeds) per workload,
     each gain with the 95 % Student-t interval across them, and every verdict drawn from
     the interval: holds (inside the tolerance), does not hold (outside), or not resolved
     with N replicates (harness/studies/reproduce_stats.py);
   - device utilization (busy fraction, slot utilization) static vs continuous;
   - --sensitivity: the same gains with one condition changed at a time;
   - MEASURED (skipped by --sim-only): the real engine on CPU (the 54M `small` model), the
     same three rows at small scale (lengths / --cpu-scale, a KV pool scaled alike),
     --cpu-replicates replicates, intervals by the same method.
Run time (docs/reproduce.md, a shared 2-core CPU): about 26 min for the whole command (the
measured CPU rows about 22 of them), 3.3 min with --sim-only, 12 min with --sim-only
--sensitivity --replicates 3.
Setting: same device memory for both; static reserves max_model_len (the longest request the
workload can produce) per slot and runs the largest batch that fits (at most B); continuous: paged KV,
max_num_seqs B (256) and 8192 batched tokens per step, vLLM's defaults.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cbbench.harness.errors import CbbenchError
from cbbench.harness.results.compare import emit_table
from cbbench.harness.studies import reproduce as rp
from cbbench.harness.studies import reproduce_report as rr
from cbbench.harness.studies import reproduce_stats as rs
from cbbench.reference_engine.config.options import SIM_DEFAULTS, add_engine_args, engine_value
from rich.console import Console

SEED_DEMO_STEPS = {"static": 22}  # the seeds' count; continuous: "fewer"
# engine flags of the simulated part; unset max_model_len = the workload's longest request,
# unset kv_cache_memory_gb = what the device leaves after the weights
ENGINE_FLAGS = (
    "hardware", "model", "batch_size", "max_num_batched_tokens", "max_model_len",
    "kv_cache_memory_gb",
)  # fmt: skip  # a gain "holds" when ours is within 15 % of the seed's


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "reproduce",
        help="regenerate the seeds' figures: seed-demo timeline, static vs continuous gains "
        "(about 26 min on 2 CPU cores; --sim-only 3 min)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sim-only", action="store_true", help="skip the measured CPU runs")
    p.add_argument("--sensitivity", action="store_true", help="add the sensitivity table")
    p.add_argument("--out", default=None, help="write run folders and reproduce.json here")
    # the simulated part's engine: the shared engine flags, with the simulator's defaults
    # but B = 256 (vLLM's max_num_seqs): continuous max_num_seqs and the cap of static's batch
    add_engine_args(p, only=ENGINE_FLAGS, defaults={**SIM_DEFAULTS, "batch_size": 256})
    p.add_argument(
        "--num-requests", type=int, default=600, help="simulated requests per workload (600)"
    )
    p.add_argument("--sim-scale", type=int, default=1,
                   help="divide the simulated prompt and output lengths by this (1)")  # fmt: skip
    p.add_argument("--replicates", type=int, default=5,
                   help="independent request sets per simulated workload (5)")  # fmt: skip
    p.add_argument("--jobs", type=int, default=1,
                   help="simulated replicates in this many processes (1)")  # fmt: skip
    p.add_argument("--workload-seed", type=int, default=0,
                   help="first workload seed; replicate k uses it + k (0)")  # fmt: skip
    g = p.add_argument_group("measured on CPU")
    g.add_argument("--cpu-model", default="small", help="default small (54M parameters)")
    g.add_argument("--cpu-batch-size", type=int, default=8, help="B on CPU (default 8)")
    g.add_argument("--cpu-requests", type=int, default=32, help="requests per replicate (32)")
    g.add_argument("--cpu-replicates", type=int, default=3,
                   help="independent request sets per measured workload (3)")  # fmt: skip
    g.add_argument(
        "--cpu-scale", type=int, default=16, help="divide prompt and output lengths by this (16)"
    )
    g.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                   help="wall, or this thread's CPU time on a machine shared with other jobs")  # fmt: skip
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    for flag in ("batch_size", "num_requests", "cpu_batch_size", "cpu_requests", "cpu_scale",
                 "max_num_batched_tokens", "sim_scale", "replicates", "cpu_replicates",
                 "jobs"):  # fmt: skip
        if getattr(args, flag) < 1:
            raise CbbenchError(
                f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}"
            )
    if args.workload_seed < 0:
        raise CbbenchError(f"--workload-seed must be >= 0, got {args.workload_seed}")


def run(args: argparse.Namespace) -> int:
    for dest in ENGINE_FLAGS:
        setattr(args, dest, engine_value(args, dest))
    _check(args)
    console = Console(soft_wrap=True)
    out = Path(args.out) if args.out else None
    steps = rr.seed_demo(console)
    sim_s = rp.Setting(
        model=args.model,
        hardware=args.hardware,
        num_requests=args.num_requests,
        max_num_seqs=args.batch_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        kv_cache_memory_gb=args.kv_cache_memory_gb,
        length_scale=args.sim_scale,
        replicates=args.replicates,
        seed=args.workload_seed,
    )
    console.rule(
        f"[bold]2a. SIMULATED: {args.model} on {args.hardware}, B={args.batch_size}, "
        f"{args.replicates} x {args.num_requests} requests per workload at t=0, sustained "
        "throughput"
    )
    sim = rr.run_rows(console, "sim", sim_s, out, "sim", jobs=args.jobs)
    t = rr.gains_table("static -> continuous, sustained req/s (SIMULATED)", sim)
    emit_table(console, t, out, "gains-sim.md")  # Markdown when piped; a copy in --out
    emit_table(console, rr.utilization_table(sim), out, "utilization-sim.md")
    sens = rr.sensitivity(console, sim_s, jobs=args.jobs) if args.sensitivity else None
    cpu = None
    if not args.sim_only:
        from cbbench.reference_engine.sim.calibration import TracedClock, _cost_for, torch_threads

        cpu_s = rr.cpu_setting(args, sim_s)
        console.rule(
            f"[bold]2b. MEASURED: the real engine ({args.cpu_model}) on CPU, B={cpu_s.max_num_seqs}, "
            f"{cpu_s.replicates} x {cpu_s.num_requests} requests, lengths / {cpu_s.length_scale}, KV pool "
            f"{cpu_s.num_kv_blocks} blocks, {args.clock} clock"
        )

        def wrap(executor, engine):
            return TracedClock(executor, _cost_for(engine), args.clock)

        with torch_threads(1):
            cpu = rr.run_rows(console, "cpu", cpu_s, out, "cpu", wrap=wrap)
        t = rr.gains_table("static -> continuous, sustained req/s (MEASURED, CPU)", cpu)
        emit_table(console, t, out, "gains-cpu.md")
    lines = rr.verdicts(sim, cpu)
    for line in lines:
        console.print(line, highlight=False, soft_wrap=True)  # whole, when piped
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        doc = {
            "seed_demo_steps": steps,
            "rows": [
                {
                    "workload": w,
                    "seed": rp.SEED_ROWS[w],
                    "simulated": rr.brief(sim[w]),
                    "measured_cpu": rr.brief(cpu[w]) if cpu else None,
                }
                for w in rp.WORKLOADS
            ],
            "seed_utilization": rp.SEED_UTILIZATION,
            "sensitivity": sens,
            "interval_method": rs.METHOD,
            "claims": {
                "simulated": rr.claims(sim),
                "measured_cpu": rr.claims(cpu) if cpu else None,
            },
            "verdicts": lines,
            "simulated": sim,
            "measured_cpu": cpu,
            "argv": sys.argv,
        }
        (out / "reproduce.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        console.print(f"wrote {out / 'reproduce.json'} and run folders under {out}")
    return 0
