"""`cbbench reproduce`: the seeds' results, regenerated with the reference engine.

1. The seed-demo timeline: outputs [10, 5, 8, 3, 12, 6], B = 4, one time unit per step
   (seeds: static 22 steps, continuous fewer, no slot idle while requests wait).
2. Throughput of continuous over static batching for uniform, mixed (outputs 10-1000) and
   heavy-mixed (1-4000) workloads (seeds: no gain; about 2.4x; about 5.7x):
   - SIMULATED: the presets on a modelled H100 serving llama-3-8b;
   - MEASURED (skipped by --sim-only): the real engine on CPU, the 54M `small` model (whose
     decode step, like a GPU's, costs about the same for 1 or 8 sequences), offline and
     in-process, on the same presets with every length divided by --cpu-scale; one torch
     thread unless CBBENCH_TORCH_THREADS says otherwise.
Both policies get the same B (static batch size = continuous max_num_seqs) and the same KV
pool; static reserves max_model_len (here: the workload's longest request) per slot, as a
static server must.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from cbbench.harness.errors import CbbenchError
from cbbench.reference_engine.options import SIM_DEFAULTS, add_engine_args, engine_value
from rich.console import Console
from rich.table import Table

WORKLOADS = ("uniform", "mixed", "heavy-mixed")
SEED_CLAIMS = {"uniform": "no gain (1x)", "mixed": "about 2.4x", "heavy-mixed": "about 5.7x"}
SEED_DEMO_STEPS = {"static": 22}  # the seeds' count; continuous: "fewer"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "reproduce",
        help="regenerate the seeds' figures: seed-demo timeline, static vs continuous gains",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sim-only", action="store_true", help="skip the measured CPU runs")
    p.add_argument("--out", default=None, help="write run folders and reproduce.json here")
    # the simulated part's engine: the shared engine flags, with the simulator's defaults
    add_engine_args(p, only=("hardware", "model", "batch_size"), defaults=SIM_DEFAULTS)
    p.add_argument(
        "--num-requests", type=int, default=200, help="simulated requests per workload (200)"
    )
    g = p.add_argument_group("measured on CPU")
    g.add_argument("--cpu-model", default="small", help="default small (54M parameters)")
    g.add_argument("--cpu-batch-size", type=int, default=8, help="B on CPU (default 8)")
    g.add_argument("--cpu-requests", type=int, default=32, help="requests per workload (32)")
    g.add_argument(
        "--cpu-scale", type=int, default=16, help="divide prompt and output lengths by this (16)"
    )
    p.set_defaults(func=run)


def _config(model: str, scheduler: str, b: int, executor: str, hardware: str, **kw):
    from cbbench.reference_engine.options import SIM_DEFAULTS, build_engine_config

    # dtype auto: the model's own (bf16 for the llama presets; fp32 for tiny)
    settings = {"model": model, "batch_size": b, "executor": executor, "hardware": hardware}
    return build_engine_config({**settings, **kw}, SIM_DEFAULTS, scheduler=scheduler)


def seed_demo(console: Console) -> dict[str, int]:
    """The seeds' timeline in engine steps (hardware `steps`: one time unit per step)."""
    from cbbench.harness.studies.simulation import print_timeline
    from cbbench.reference_engine.simulate import replay
    from cbbench.workloads import load_workload

    wl = load_workload("seed-demo")
    console.rule("[bold]1. seed demo: outputs [10, 5, 8, 3, 12, 6], B = 4 (SIMULATED steps)")
    steps = {}
    for name in ("static", "continuous"):
        res = replay(wl.requests, _config("tiny", name, 4, "sim", "steps"), timeline=True)
        print_timeline(console, name, res)
        steps[name] = len(res.steps)
    console.print(
        f"static {steps['static']} steps (seeds: 22), continuous {steps['continuous']} steps "
        f"(seeds: fewer, no slot idle while requests wait)"
    )
    return steps


def scaled_workload(name: str, n: int, scale: int):
    """A preset with every prompt and output length divided by `scale` (at least 1)."""
    from cbbench.workloads import load_workload
    from cbbench.workloads.spec import Workload

    wl = load_workload(name, num_requests=n)
    if scale == 1:
        return wl
    reqs = tuple(
        dataclasses.replace(
            r, prompt_len=max(1, r.prompt_len // scale), output_len=max(1, r.output_len // scale)
        )
        for r in wl.requests
    )
    return Workload(f"{name}/{scale}", wl.seed, reqs, wl.prefix_block_size, wl.source)


def _replay(console: Console, label: str, wl, cfg, out: Path | None, folder: str) -> dict:
    from cbbench.harness.studies.simulation import write_run
    from cbbench.reference_engine.simulate import replay

    t0 = time.perf_counter()
    with console.status(f"{label}: {wl.name}, {cfg.scheduler} ({len(wl)} requests) ..."):
        res = replay(wl.requests, cfg)
    s = res.summary()
    console.print(
        f"  {label} {wl.name:<12} {cfg.scheduler:<10} B={cfg.max_batch_slots:<4} "
        f"{s['num_steps']:>6} steps  {s['output_throughput'] or 0:>9.1f} output tok/s"
        f"  ({time.perf_counter() - t0:.1f}s wall)",
        highlight=False,
    )
    if out is not None:
        write_run(
            out / folder / wl.name.replace("/", "_"), cfg.scheduler, res, wl,
            workload_name=wl.name, command=sys.argv,
        )  # fmt: skip
    return s


def simulated(args: argparse.Namespace, console: Console, out: Path | None) -> dict:
    from cbbench.workloads import load_workload

    b = args.batch_size
    console.rule(
        f"[bold]2a. SIMULATED: {args.model} on {args.hardware}, B={b}, "
        f"{args.num_requests} requests per workload, all at once"
    )
    rows = {}
    for wname in WORKLOADS:
        wl = load_workload(wname, num_requests=args.num_requests)
        max_len = max(r.prompt_len + r.output_len for r in wl.requests)
        kw = {"max_model_len": max(max_len, 2)}
        # The pool is sized from the device; static's reservation must fit B slots in it.
        st = _replay(
            console,
            "sim",
            wl,
            _config(args.model, "static", b, "sim", args.hardware, **kw),
            out,
            "sim",
        )
        co = _replay(
            console,
            "sim",
            wl,
            _config(args.model, "continuous", b, "sim", args.hardware, **kw),
            out,
            "sim",
        )
        rows[wname] = _row(st, co)
    return rows


def measured(args: argparse.Namespace, console: Console, out: Path | None) -> dict:
    b, n, scale = args.cpu_batch_size, args.cpu_requests, args.cpu_scale
    console.rule(
        f"[bold]2b. MEASURED: the real engine ({args.cpu_model}) on CPU, B={b}, {n} requests "
        f"per workload, lengths / {scale}, offline in-process replay"
    )
    from cbbench.harness.cli.compare_engines import torch_threads
    from cbbench.reference_engine.simulate import replay

    text = os.environ.get("CBBENCH_TORCH_THREADS", "1")  # busy cores: threads spin
    if not text.isdigit():
        raise CbbenchError(f"CBBENCH_TORCH_THREADS must be a whole number, got {text!r}")
    threads = int(text)
    with torch_threads(threads):
        return _measured_rows(args, console, out, replay)


def _measured_rows(args: argparse.Namespace, console: Console, out: Path | None, replay) -> dict:
    b, n, scale = args.cpu_batch_size, args.cpu_requests, args.cpu_scale

    warm = scaled_workload("uniform", 2, 64)
    with console.status("cpu: warm-up ..."):
        cfg = _config(args.cpu_model, "continuous", b, "real", "h100", max_model_len=64)
        replay(warm.requests, cfg)
    rows = {}
    for wname in WORKLOADS:
        wl = scaled_workload(wname, n, scale)
        max_len = max(r.prompt_len + r.output_len for r in wl.requests)
        kw = {"max_model_len": max(max_len, 2)}
        st = _replay(
            console,
            "cpu",
            wl,
            _config(args.cpu_model, "static", b, "real", "h100", **kw),
            out,
            "cpu",
        )
        co = _replay(
            console,
            "cpu",
            wl,
            _config(args.cpu_model, "continuous", b, "real", "h100", **kw),
            out,
            "cpu",
        )
        rows[wname] = _row(st, co)
    return rows


def _ratio(a: dict, b: dict) -> float | None:
    x, y = a.get("output_throughput"), b.get("output_throughput")
    return x / y if x and y else None


def _row(static: dict, cont: dict) -> dict:
    return {
        "static_tok_s": static["output_throughput"],
        "continuous_tok_s": cont["output_throughput"],
        "ratio": _ratio(cont, static),
        "static_steps": static["num_steps"],
        "continuous_steps": cont["num_steps"],
        "static_e2e_p99_s": static["e2e_s"]["p99"],
        "continuous_e2e_p99_s": cont["e2e_s"]["p99"],
    }


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def results_table(args: argparse.Namespace, sim: dict, cpu: dict | None) -> Table:
    t = Table(title="continuous vs static batching: output tokens/s (same B, same KV pool)")
    t.add_column("workload")
    t.add_column("seeds' claim")
    t.add_column(f"SIMULATED {args.hardware} static", justify="right")
    t.add_column("continuous", justify="right")
    t.add_column("gain", justify="right", style="bold")
    if cpu is not None:
        t.add_column("MEASURED cpu static", justify="right")
        t.add_column("continuous", justify="right")
        t.add_column("gain", justify="right", style="bold")
    for w in WORKLOADS:
        s = sim[w]
        cells = [
            w,
            SEED_CLAIMS[w],
            _fmt(s["static_tok_s"], ",.0f"),
            _fmt(s["continuous_tok_s"], ",.0f"),
            _fmt(s["ratio"], ".2f") + "x",
        ]
        if cpu is not None:
            c = cpu[w]
            cells += [
                _fmt(c["static_tok_s"], ",.0f"),
                _fmt(c["continuous_tok_s"], ",.0f"),
                _fmt(c["ratio"], ".2f") + "x",
            ]
        t.add_row(*cells)
    t.caption = (
        f"simulated: {args.model}, B={args.batch_size}, {args.num_requests} requests each; "
        + (
            f"measured: {args.cpu_model} on CPU, B={args.cpu_batch_size}, {args.cpu_requests} "
            f"requests each, lengths / {args.cpu_scale}"
            if cpu is not None
            else "measured: skipped (--sim-only)"
        )
    )
    return t


def run(args: argparse.Namespace) -> int:
    for dest in ("hardware", "model", "batch_size"):
        setattr(args, dest, engine_value(args, dest))
    for flag in ("batch_size", "num_requests", "cpu_batch_size", "cpu_requests", "cpu_scale"):
        if getattr(args, flag) < 1:
            raise CbbenchError(
                f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}"
            )
    console = Console()
    out = Path(args.out) if args.out else None
    steps = seed_demo(console)
    sim = simulated(args, console, out)
    cpu = None if args.sim_only else measured(args, console, out)
    console.print(results_table(args, sim, cpu))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        doc = {"seed_demo_steps": steps, "simulated": sim, "measured_cpu": cpu, "argv": sys.argv}
        (out / "reproduce.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        console.print(f"wrote {out / 'reproduce.json'} and run folders under {out}")
    return 0
