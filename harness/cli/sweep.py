"""`cbbench sweep`: one benchmark per load level into one folder, for `cbbench report` curves.

Parse -> SweepOptions -> harness.sweep.runner.run_sweep -> print."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cbbench.harness.cli.bench import add_reasoning_args
from cbbench.harness.durations import seconds_arg
from cbbench.harness.results.slo import SLO_HELP
from cbbench.harness.sweep.levels import parse_list
from cbbench.harness.telemetry import TelemetryOptions


def register(sub: argparse._SubParsersAction) -> None:
    from cbbench.harness.client.endpoints import ENDPOINTS

    p = sub.add_parser(
        "sweep",
        help="benchmark a server at several load levels into one folder (for report curves)",
        description="Run one benchmark per load level (open-loop rates, closed-loop "
        "concurrencies, or --auto: synchronous -> all at once -> rates in between) into one "
        "folder; a level stops early when the server is clearly over-saturated.",
    )
    p.add_argument("--base-url", required=True, help="server root, e.g. http://127.0.0.1:8000")
    p.add_argument("--workload", default="mixed", help="preset name, trace file or spec file")
    levels = p.add_mutually_exclusive_group(required=True)
    levels.add_argument("--rates", help="open-loop request rates, e.g. 1,2,4,8 (req/s)")
    levels.add_argument("--concurrency", help="closed-loop concurrencies, e.g. 1,4,16,64")
    levels.add_argument(
        "--auto", action="store_true", help="synchronous, all at once, then rates in between"
    )
    levels.add_argument(
        "--find-max-rate",
        action="store_true",
        help="SLO capacity search: the highest rate whose goodput meets --goodput-share (needs --slo)",
    )
    p.add_argument("--out", required=True, help="sweep folder (one run folder per level)")
    p.add_argument("--num-requests", type=int, default=50, help="requests per level (default 50)")
    p.add_argument("--between", type=int, default=4, help="--auto: rates in between (default 4)")
    p.add_argument(
        "--level-timeout", type=seconds_arg, default=300.0, help="per level at most (300s)"
    )
    p.add_argument("--max-levels", type=int, default=12, help="levels at most (default 12)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--endpoint", choices=ENDPOINTS, default="completions")
    p.add_argument("--model", help="model name (default: the first one /v1/models lists)")
    p.add_argument("--slo", help=SLO_HELP)
    p.add_argument("--goodput", nargs="+", metavar="KEY:MS",
                   help="vLLM's spelling of --slo, in milliseconds, as bench's: --goodput "
                        "ttft:200 tpot:50 e2el:10000")  # fmt: skip
    p.add_argument("--warmup", type=int, default=0, help="warmup requests per level")
    p.add_argument(
        "--timeout", type=seconds_arg, default=600.0, help="per-request limit (600s; 10m)"
    )
    p.add_argument("--api-key", help="sent as a Bearer token")
    p.add_argument("--no-live", action="store_true", help="no live view per level")
    p.add_argument(
        "--arrival",
        choices=("poisson", "constant"),
        default=None,
        help="arrival process of rate levels (default poisson)",
    )
    c = p.add_argument_group("capacity search (--find-max-rate)")
    c.add_argument(
        "--goodput-share",
        type=float,
        default=0.95,
        help="share of requests meeting every --slo target (0.95), as plan's",
    )
    c.add_argument("--start-rate", type=float, default=1.0, help="first rate tried (1 req/s)")
    c.add_argument("--max-rate", type=float, default=1000.0, help="highest rate tried")
    c.add_argument("--precision", type=float, default=0.1, help="stop at hi/lo <= 1+this (0.1)")
    c.add_argument(
        "--repeats", type=int, default=3,
        help="runs of a level whose first run missed; met when most of them meet (default 3)",
    )  # fmt: skip
    c.add_argument("--max-requests", type=int, default=2000, help="request budget (2000)")
    c.add_argument("--max-time", type=seconds_arg, default=1800.0, help="time budget (30m)")
    add_reasoning_args(p)
    TelemetryOptions.add_args(p)
    p.set_defaults(func=run)


def sweep_options(args: argparse.Namespace):
    """The typed options of the parsed flags."""
    from cbbench.harness.cli.plan import goodput_share
    from cbbench.harness.load.options import ClientOptions, LoadOptions, reasoning_body
    from cbbench.harness.load.vllm_compat import goodput_as_slo
    from cbbench.harness.sweep.runner import SweepOptions

    extra = reasoning_body(args.endpoint, args.reasoning_effort, args.chat_template_kwargs)
    slo, share = goodput_as_slo(args.goodput, args.slo)

    return SweepOptions(
        base_url=args.base_url,
        out=Path(args.out),
        load=LoadOptions(
            workload=args.workload, seed=args.seed, num_requests=args.num_requests,
            arrival=args.arrival, warmup=args.warmup,
        ),
        client=ClientOptions(
            endpoint=args.endpoint, model=args.model, slo=slo, api_key=args.api_key,
            timeout_s=args.timeout, reasoning_parser=args.reasoning_parser, extra_body=extra,
        ),
        telemetry=TelemetryOptions.from_args(args),
        rates=parse_list(args.rates, "--rates") if args.rates else None,
        concurrency=parse_list(args.concurrency, "--concurrency", int) if args.concurrency else None,
        find_max_rate=args.find_max_rate,
        between=args.between,
        level_timeout_s=args.level_timeout,
        max_levels=args.max_levels,
        live=not args.no_live,
        command=list(sys.argv),
        goodput=args.goodput_share if share is None else goodput_share(share),
        start_rate=args.start_rate,
        max_rate=args.max_rate,
        precision=args.precision,
        repeats=args.repeats,
        max_requests=args.max_requests,
        max_time_s=args.max_time,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from cbbench.harness.sweep.capacity_run import find_max_rate, print_capacity
    from cbbench.harness.sweep.runner import print_sweep, run_sweep

    opts = sweep_options(args)
    if opts.find_max_rate:
        index = find_max_rate(opts)
        print_sweep(index, opts.out)  # the levels' table, as for any sweep (and sweep.md)
        print_capacity(index)
    else:
        index = run_sweep(opts)
        print_sweep(index, opts.out)
    print(f"sweep folder: {opts.out}  (cbbench report {opts.out})", file=sys.stderr)
    return 130 if index.get("status") == "interrupted" else 0
