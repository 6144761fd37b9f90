"""`cbbench sim`: the reference engine's schedulers on a workload, in simulated time.

Parse -> SimOptions -> harness.studies.simulation.simulate -> print. Output is SIMULATED
(`--executor real`: the real model offline, in-process, wall clock: MEASURED).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cbbench.harness.cli.parsing import schedulers_flag
from cbbench.harness.errors import CbbenchError
from cbbench.reference_engine.config.options import (
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
    p.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="sampling temperature of every request (0 = greedy; --executor real only)",
    )
    p.add_argument("--out", default=None, help="write one run folder per scheduler under DIR")
    p.add_argument(
        "--spec-sweep",
        default=None,
        metavar="BATCHES",
        help="instead of a workload: speculative speed-up vs batch size (e.g. 1,4,16,64,256) "
        "at --spec-sweep-rates, with the --speculative-* flags given",
    )
    p.add_argument("--spec-sweep-rates", default="0.6,0.8", help="acceptance rates of --spec-sweep")
    p.add_argument(
        "--replicas",
        type=int,
        default=None,
        metavar="N",
        help="simulate N replicas behind a router (one of --schedulers, default continuous) and "
        "compare the --router policies (docs/router.md)",
    )
    p.add_argument(
        "--router",
        default=None,
        metavar="POLICIES",
        help="with --replicas: routing policies to compare, comma-separated (default all: "
        "round-robin,least-outstanding,kv-aware,prefix-affinity)",
    )
    p.add_argument(
        "--prefill-replicas",
        type=int,
        default=None,
        metavar="P",
        help="with --decode-replicas: P prefill + D decode workers against P + D aggregated "
        "replicas, side by side (docs/disaggregation.md)",
    )
    p.add_argument("--decode-replicas", type=int, default=None, metavar="D",
                   help="decode workers of the P/D comparison")  # fmt: skip
    p.add_argument("--kv-link", default=None,
                   help="the P/D comparison's KV link: same-node, cross-node, loopback, "
                        "bandwidth_gbps=B,latency_ms=L or fit (the --hardware JSON's measured "
                        "fit.kv_link; the default when it has one, else same-node)")  # fmt: skip
    add_engine_args(p, defaults=SIM_DEFAULTS)
    schedulers_flag(p, "batching policies to compare, a comma list of static, dynamic, "
                    "continuous (default: all three; with --replicas, one: continuous)")  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cbbench.harness.studies.simulation import SimOptions, print_study, simulate
    from rich.console import Console

    console = Console(soft_wrap=True)
    if args.spec_sweep is not None:
        return _spec_sweep(args, console)
    if args.replicas is not None:
        return _cluster(args, console)
    if args.prefill_replicas is not None or args.decode_replicas is not None:
        return _pd(args, console)
    settings = engine_settings(args)
    flag = getattr(args, "scheduler_flag", "--schedulers")
    names = scheduler_names(settings.pop("scheduler", None), flag=flag)
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
        temperature=args.temperature,
        out=Path(args.out) if args.out else None,
        command=list(sys.argv),
    )
    print_study(simulate(opts, console), console)
    return 0


def _floats(text: str, flag: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise CbbenchError(f"{flag}: expected a comma list of numbers, got {text!r}") from None


def _spec_sweep(args: argparse.Namespace, console) -> int:
    from cbbench.harness.studies.spec_sweep import SpecSweepOptions, print_sweep, spec_sweep
    from cbbench.reference_engine.config.options import build_engine_config

    settings = engine_settings(args)
    if settings.get("speculative_method") is None:
        raise CbbenchError("--spec-sweep needs --speculative-method (and its flags)")
    batches = tuple(int(b) for b in _floats(args.spec_sweep, "--spec-sweep"))
    if not batches or min(batches) < 1:
        raise CbbenchError(f"--spec-sweep: batch sizes must be >= 1, got {args.spec_sweep!r}")
    rates = _floats(args.spec_sweep_rates, "--spec-sweep-rates")
    base = build_engine_config(settings, SIM_DEFAULTS, scheduler="continuous")
    opts = SpecSweepOptions(base, batch_sizes=batches, acceptance_rates=rates)
    print_sweep(opts, spec_sweep(opts), console)
    return 0


def _cluster(args: argparse.Namespace, console) -> int:
    from cbbench.harness.studies.cluster import (
        ClusterOptions,
        policy_names,
        print_cluster_study,
        simulate_cluster_study,
    )
    from cbbench.harness.studies.simulation import SimOptions

    if args.replicas < 1:
        raise CbbenchError(f"--replicas must be >= 1, got {args.replicas}")
    settings = engine_settings(args)
    names = scheduler_names(settings.pop("scheduler", None), default=("continuous",))
    seed = settings.pop("seed", None)
    sim = SimOptions(
        workload=args.workload,
        schedulers=names,
        engine=settings,
        seed=seed,
        num_requests=args.num_requests,
        rate=args.rate,
        drop_too_long=args.drop_too_long,
        out=Path(args.out) if args.out else None,
        command=list(sys.argv),
    )
    opts = ClusterOptions(sim, args.replicas, policy_names(args.router))
    print_cluster_study(simulate_cluster_study(opts, console), console)
    return 0


def _pd(args: argparse.Namespace, console) -> int:
    from cbbench.harness.studies.pd_compare import PDCompareOptions, pd_compare, print_pd_compare
    from cbbench.harness.studies.simulation import SimOptions

    settings = engine_settings(args)
    settings.pop("scheduler", None)
    seed = settings.pop("seed", None)
    sim = SimOptions(
        workload=args.workload, schedulers=["continuous"], engine=settings, seed=seed,
        num_requests=args.num_requests, rate=args.rate, drop_too_long=args.drop_too_long,
        out=Path(args.out) if args.out else None, command=list(sys.argv),
    )  # fmt: skip
    opts = PDCompareOptions(sim, args.prefill_replicas or 0, args.decode_replicas or 0,
                            args.kv_link)  # fmt: skip
    print_pd_compare(opts, pd_compare(opts, console), console)
    return 0
