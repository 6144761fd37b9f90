"""`cbbench run`: the one-command demo. Once per scheduler (static, dynamic, continuous), start
the reference engine's server, replay one workload against it over HTTP with the load
generator and telemetry on, then print the runs side by side and write an HTML report.

Same model, same KV pool, same batch size B (static batch size = dynamic max batch size =
continuous max_num_seqs), same requests: only the batching policy changes. `--sim HARDWARE`
runs the same comparison in the simulator instead (in-process, virtual time, SIMULATED).

Speculative decoding: give `--speculative-method` (and its flags) and a "continuous+spec"
server runs right after plain "continuous" on the same workload, side by side, e.g.
`cbbench run --schedulers continuous --speculative-method draft --speculative-model tiny`.

KV-cache dtypes side by side: `--kv-cache-dtype auto,bf16,int8` runs every scheduler once per
dtype with the same --kv-cache-memory-gb ("continuous", "continuous+bf16", "continuous+int8");
the table shows each run's KV blocks, capacity, running sequences and preemptions.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from cbbench.harness.cli.parsing import schedulers_flag
from cbbench.harness.errors import CbbenchError
from cbbench.harness.results.slo import SLO_HELP
from cbbench.reference_engine.config.engine_config import KV_CACHE_DTYPES
from cbbench.reference_engine.config.options import (
    add_engine_args,
    engine_settings,
    scheduler_names,
)

DEFAULT_SLO = "ttft=10s,tpot=100ms"
DEFAULT_SIM_MODEL = "llama-3-8b"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="the demo: static vs dynamic vs continuous batching on the reference engine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--workload",
        default=None,
        help="preset, trace or spec file (default: run-demo, 256 mixed-length requests)",
    )
    p.add_argument("--num-requests", type=int, default=None, help="first N requests")
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="closed loop with this many requests in flight (default: all at once)",
    )
    p.add_argument(
        "--rate", type=float, default=None, help="open loop: Poisson arrivals at R req/s"
    )
    p.add_argument("--slo", default=DEFAULT_SLO, help=f"{SLO_HELP} (default {DEFAULT_SLO})")
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sampling temperature sent with every request (0 = greedy; default: the server's)",
    )
    p.add_argument(
        "--sim",
        metavar="HARDWARE",
        default=None,
        help="simulate instead (h100, a100-80g, h200, cpu-measured, steps or a calibrate JSON); "
        f"the model then defaults to {DEFAULT_SIM_MODEL}",
    )
    p.add_argument("--out", default=None, help="parent folder (default results/runs/<time>-run)")
    p.add_argument("--no-report", action="store_true", help="skip the HTML report")
    p.add_argument("--no-live", action="store_true", help="no live view during each run")
    add_engine_args(p, help_defaults={"device": "cuda if present, else cpu"})
    # run only: the engine flag takes a comma list (run_options splits it)
    kv = next(a for a in p._actions if a.dest == "kv_cache_dtype")
    kv.choices, kv.metavar = None, "DTYPE[,DTYPE...]"
    kv.help = f"{kv.help}; a comma list runs every scheduler once per dtype, side by side"
    schedulers_flag(p, "batching policies to compare, a comma list of static, dynamic, "
                    "continuous (default: all three; --scheduler is the old spelling)")  # fmt: skip
    p.set_defaults(func=run)


def kv_cache_dtypes(text: str) -> list[str]:
    """`--kv-cache-dtype auto,int8` -> ["auto", "int8"] (CbbenchError naming a bad entry)."""
    names = [s.strip() for s in text.split(",")]
    bad = [s for s in names if s not in KV_CACHE_DTYPES]
    if bad:
        raise CbbenchError(
            f"--kv-cache-dtype {text}: unknown {', '.join(repr(b) for b in bad)} "
            f"(choose from {', '.join(KV_CACHE_DTYPES)})"
        )
    return list(dict.fromkeys(names))


def run_options(args: argparse.Namespace):
    """The typed options of the parsed flags."""
    from cbbench.harness.studies.run_demo import RunOptions

    engine = engine_settings(args)
    names = scheduler_names(
        engine.pop("scheduler", None), flag=getattr(args, "scheduler_flag", "--schedulers")
    )
    seed = engine.pop("seed", 0)
    dtypes = kv_cache_dtypes(engine["kv_cache_dtype"]) if "kv_cache_dtype" in engine else []
    if len(dtypes) == 1:  # one value: the engine setting, as on every other command
        engine["kv_cache_dtype"], dtypes = dtypes[0], []
    elif dtypes:
        engine.pop("kv_cache_dtype")
    sim = args.sim
    if engine.get("executor") == "sim" and not sim:
        sim = engine.get("hardware") or "h100"
    return RunOptions(
        schedulers=names,
        engine=engine,
        kv_cache_dtypes=dtypes,
        workload=args.workload,
        num_requests=args.num_requests,
        seed=seed,
        concurrency=args.concurrency,
        rate=args.rate,
        slo=args.slo,
        temperature=args.temperature,
        sim=sim,
        out=Path(args.out) if args.out else None,
        report=not args.no_report,
        live=not args.no_live,
        command=list(sys.argv),
    )


def run(args: argparse.Namespace) -> int:
    from cbbench.harness.studies.run_demo import run_demo
    from rich.console import Console

    opts = run_options(args)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # started with `&` by a script: the shell ignores SIGINT for it; as `bench` does,
        # `kill -INT` (Ctrl-C) stops the run and keeps what finished, server start-up included
        signal.signal(signal.SIGINT, signal.default_int_handler)
    console = Console(soft_wrap=True)
    res = run_demo(opts, console)
    if res.summaries:
        from cbbench.harness.results.compare import comparison_table, emit_table

        table = comparison_table(res.summaries, _title(opts, res.device))
        if "static" in res.summaries and opts.rate is None:
            drain = opts.engine.get("drain_timeout", 1.0)
            note = (
                f"static: a server cannot know that no request will follow, so its last, "
                f"partial batch waits --drain-timeout ({drain:g}s) before it runs (in the "
                f"duration); `cbbench sim` knows and runs it at once"
            )
            table.caption = f"{table.caption}; {note}" if table.caption else note
        console.print(f"table: {emit_table(console, table, res.parent)}")
        if res.caution:
            console.print(f"caution: {res.caution}", highlight=False, soft_wrap=True)
    if res.report is not None:
        console.print(f"report: {res.report}")
    console.print(f"run folders: {res.parent}/{{{','.join(d.name for d in res.run_dirs)}}}")
    return 130 if res.interrupted else 0


def _title(opts, device: str) -> str:
    from cbbench.harness.studies.run_demo import RUN_WORKLOAD

    wl = opts.workload or RUN_WORKLOAD["name"]
    model = opts.engine.get("model", "tiny")
    b = opts.engine.get("batch_size", 8)
    return f"MEASURED over HTTP: {model} on {device}, workload {wl}, B={b} " + (
        "(same KV memory for every run: its blocks per KV dtype)"
        if opts.kv_cache_dtypes
        else "(same KV pool for every scheduler)"
    )


if __name__ == "__main__":
    from cbbench.harness.cli import main

    sys.exit(main(["run", *sys.argv[1:]]))
