"""`cbbench plan`: the cheapest configuration that meets an SLO, searched in the simulator.

Parse -> PlanOptions -> planner.plan (harness/planning/planner.py) -> the frontier, the chosen
configuration as `cbbench serve` and vLLM flags, plan.json + plan.html under --out.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="the cheapest simulated configuration (replicas, batching) that meets an SLO",
        description="Search a declared space of configurations (replicas by bisection, "
        "scheduler, max_num_seqs, token budget, chunked prefill, KV dtype, router) in the "
        "simulator for the cheapest that meets every SLO, with the prediction interval in "
        "each verdict. Every figure is SIMULATED.",
    )
    p.add_argument("--workload", default="chat", help="a preset, spec or trace (default chat)")
    p.add_argument("--rate", default=None,
                   help="requests/s (Poisson arrivals), or several (10,20,40): a plan per rate; "
                        "default: the trace's own arrival times")  # fmt: skip
    p.add_argument("--slo",
                   help="METRIC[_STAT]=DURATION,... as bench's: ttft|ttfo|tpot|e2e and "
                        "mean|p50|p90|p95|p99|max, e.g. ttft_p99=2s,tpot_p99=100ms; a bare "
                        "METRIC (ttft=2s) is every request within it (the max)")  # fmt: skip
    p.add_argument("--goodput-share", default=None, metavar="SHARE",
                   help="also require this share of requests within every --slo target, as a "
                        "request-level bound (0.95 or 95%%), as sweep's")  # fmt: skip
    p.add_argument("--goodput", nargs="+", metavar="KEY:MS",
                   help="vLLM's spelling of bare --slo targets, in milliseconds, as bench's: "
                        "--goodput ttft:200 tpot:50 is --slo ttft=200ms,tpot=50ms")  # fmt: skip
    p.add_argument("--hardware", required=True,
                   help="a preset (h100, a100, ...) or a `cbbench calibrate` JSON fit")  # fmt: skip
    p.add_argument("--model", default=None, help="default: the fit's model, else llama-3-8b")
    p.add_argument(
        "--price",
        type=float,
        required=True,
        help="$ per GPU-hour (a replica of --space tp=N GPUs costs N times it)",
    )
    p.add_argument("--space", default=None,
                   help="KEY=VALUES;... over the default space, KEY one of replicas (1-32), "
                        "scheduler, max_num_seqs, max_num_batched_tokens, chunked_prefill "
                        "(on,off), kv_cache_dtype, router, speculative (off,ngram:K,"
                        "draft:MODEL:K), tp (auto or GPUs per replica, e.g. 1,2,4,8)")  # fmt: skip
    p.add_argument("--spec-acceptance-rate", type=float, default=0.7,
                   help="for speculative configurations in --space (speculative=off,ngram:4): "
                        "each draft token's acceptance probability, which the simulator cannot "
                        "know (measure it on your traffic; default 0.7)")  # fmt: skip
    p.add_argument("--num-requests", type=int, default=600, help="requests simulated (600)")
    p.add_argument("--drop-too-long", action="store_true",
                   help="skip requests whose prompt + output exceed the model's max_model_len "
                        "(else such a workload is an error naming the longest request)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="workload seed (0)")
    p.add_argument("--jobs", type=int, default=1, help="configurations in parallel processes")
    p.add_argument("--out", default=None, help="write plan.json and plan.html here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cbbench.harness.console.progress import step_progress
    from cbbench.harness.errors import CbbenchError
    from cbbench.harness.planning import planner
    from cbbench.harness.planning import report as plan_report
    from cbbench.harness.planning import space as plan_space
    from rich.console import Console

    if args.jobs < 1 or (args.num_requests is not None and args.num_requests < 1):
        raise CbbenchError("--jobs and --num-requests must be >= 1")
    from cbbench.harness.load.vllm_compat import goodput_as_slo

    slo, old_share = goodput_as_slo(args.goodput, args.slo)
    if not slo:
        raise CbbenchError("plan needs --slo (or vLLM's --goodput KEY:MS): the targets to meet")
    text = args.goodput_share if old_share is None else old_share
    share = None if text is None else goodput_share(text)
    if not 0 <= args.spec_acceptance_rate <= 1:
        raise CbbenchError(
            f"--spec-acceptance-rate must be in [0, 1], got {args.spec_acceptance_rate}"
        )
    try:
        rates = [float(r) for r in args.rate.split(",")] if args.rate else [None]
    except ValueError:
        raise CbbenchError(f"--rate: {args.rate!r} is not a number or a list of them") from None
    opts = planner.PlanOptions(
        workload=args.workload, rate=rates[0], slos=plan_space.parse_slos(slo),
        hardware=args.hardware, price_per_replica_hour=args.price, model=args.model,
        space=plan_space.parse_space(args.space), num_requests=args.num_requests,
        seed=args.seed, jobs=args.jobs, goodput_share=share,
        spec_acceptance_rate=args.spec_acceptance_rate, drop_too_long=args.drop_too_long,
    )  # fmt: skip
    console = Console(soft_wrap=True)
    total = len(opts.space.configs())
    out = Path(args.out) if args.out else None
    for rate in rates:
        o = replace(opts, rate=rate)
        load = "the trace's arrival times" if rate is None else f"{rate:g} req/s"
        with step_progress(console, f"plan at {load}", total, "configurations") as update:
            res = planner.plan(o, on_progress=lambda done, _total: update(done))
        where = out / f"rate-{rate:g}" if out is not None and len(rates) > 1 else out
        plan_report.print_plan(res, console, where)
        if res.interrupted:
            return 130
    return 0


def goodput_share(text: str) -> float:
    """'0.95' or '95%' -> 0.95; a vLLM-style target (ttft:200) or a share outside (0, 1]
    is one line saying what plan's --goodput takes."""
    from cbbench.harness.errors import CbbenchError

    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise CbbenchError(
            f"--goodput-share {text!r}: the share of requests within every --slo target (e.g. "
            f"0.95 or 95%); put the targets in --slo (ttft_p99=200ms,...)"
        ) from None
    if not 0 < v <= 1:
        hint = f" (did you mean {v / 100:g}?)" if 1 < v <= 100 else ""
        raise CbbenchError(
            f"--goodput-share must be a share in (0, 1] or a percentage, got {text}{hint}"
        )
    return v
