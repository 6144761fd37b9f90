"""`cbbench sim`: the reference engine's schedulers on a workload, in simulated time.

Parse -> SimOptions -> harness.studies.simulation.simulate -> print. Output is SIMULATED
(`--executor real`: the real model offline, in-process, wall clock: MEASURED).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cbbench.reference_engine.options import (
    SIM_DEFAULTS,
    add_engine_args,
    engine_settings,
    scheduler_names,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sim",
        help="compare static / dynamic / continuous batching in simulated time",
        description="Run the reference engine's schedulers over a workload with a simulated "
        "executor (modelled step times on the chosen hardware). Output is SIMULATED.",
    )
    p.add_argument("--workload", default="mixed", help="preset name, trace path or spec file")
    p.add_argument("--num-requests", type=int, default=None)
    p.add_argument("--rate", type=float, default=None, help="Poisson arrivals at R req/s")
    p.add_argument(
        "--drop-too-long",
        action="store_true",
        help="skip requests whose prompt + output exceed max_model_len (counted on screen)",
    )
    p.add_argument("--timeline", action="store_true", help="print the step-by-step slot timeline")
    p.add_argument("--out", default=None, help="write one run folder per scheduler under DIR")
    add_engine_args(p, defaults=SIM_DEFAULTS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cbbench.harness.studies.simulation import SimOptions, print_study, simulate
    from rich.console import Console

    console = Console()
    settings = engine_settings(args)
    names = scheduler_names(settings.pop("scheduler", None))
    seed = settings.pop("seed", None)
    opts = SimOptions(
        workload=args.workload,
        schedulers=names,
        engine=settings,
        seed=seed,
        num_requests=args.num_requests,
        rate=args.rate,
        drop_too_long=args.drop_too_long,
        timeline=args.timeline,
        out=Path(args.out) if args.out else None,
        command=list(sys.argv),
    )
    print_study(simulate(opts, console), console)
    return 0
