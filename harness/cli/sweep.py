"""`cbbench sweep`: one benchmark per load level into one folder, for `cbbench report` curves."""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import time
from pathlib import Path

from cbbench.harness.errors import CbbenchError
from cbbench.harness.sweep import Level, SaturationWatch, auto_rates, parse_list
from cbbench.harness.telemetry import TelemetryOptions, build_samplers

SWEEP_FILE = "sweep.json"
SUSTAINED = 0.9  # achieved/offered request rate above which a rate level is sustained


def register(sub: argparse._SubParsersAction) -> None:
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
        help="SLO capacity search: the highest rate whose goodput meets --goodput (needs --slo)",
    )
    p.add_argument("--out", required=True, help="sweep folder (one run folder per level)")
    p.add_argument("--num-requests", type=int, default=50, help="requests per level (default 50)")
    p.add_argument("--between", type=int, default=4, help="--auto: rates in between (default 4)")
    p.add_argument(
        "--level-timeout", type=float, default=300.0, help="seconds per level at most (300)"
    )
    p.add_argument("--max-levels", type=int, default=12, help="levels at most (default 12)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    p.add_argument("--model", help="model name (default: the first one /v1/models lists)")
    p.add_argument("--slo", help="goodput SLOs, e.g. ttft=200ms,tpot=50ms,e2e=10s")
    p.add_argument("--warmup", type=int, default=0, help="warmup requests per level")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request limit in seconds")
    p.add_argument("--api-key", help="sent as a Bearer token")
    p.add_argument("--no-live", action="store_true", help="no live view per level")
    p.add_argument(
        "--arrival",
        choices=("poisson", "constant"),
        default=None,
        help="arrival process of rate levels (default poisson)",
    )
    c = p.add_argument_group("capacity search (--find-max-rate)")
    c.add_argument("--goodput", type=float, default=0.95, help="share meeting the SLO (0.95)")
    c.add_argument("--start-rate", type=float, default=1.0, help="first rate tried (1 req/s)")
    c.add_argument("--max-rate", type=float, default=1000.0, help="highest rate tried")
    c.add_argument("--precision", type=float, default=0.1, help="stop at hi/lo <= 1+this (0.1)")
    c.add_argument("--repeats", type=int, default=2, help="runs of a missing level (default 2)")
    c.add_argument("--max-requests", type=int, default=2000, help="request budget (2000)")
    c.add_argument("--max-time", type=float, default=1800.0, help="time budget, s (1800)")
    TelemetryOptions.add_args(p)
    p.set_defaults(func=run)


def run_level(args: argparse.Namespace, level: Level, out: Path) -> dict:
    from cbbench.harness.load_options import ClientOptions, LoadOptions, bench_config
    from cbbench.harness.runner import run_bench
    from rich.console import Console

    load = LoadOptions.from_args(
        args, rate=level.rate, concurrency=level.concurrency, duration=None
    )
    client = ClientOptions(
        endpoint=args.endpoint, model=args.model, slo=args.slo, api_key=args.api_key,
        timeout_s=args.timeout,
    )  # fmt: skip
    name = f"{Path(str(args.workload)).name}-{level.name}"
    cfg = bench_config(
        args.base_url, load, client, out_dir=str(out / level.name), name=name,
        live=not args.no_live, command=list(sys.argv),
    )  # fmt: skip
    cfg.load = {**cfg.load, "sweep_level": level.name}
    samplers = list(build_samplers(TelemetryOptions.from_args(args), cfg.base_url))
    watch = SaturationWatch(Path(cfg.out_dir), len(cfg.workload), args.level_timeout)
    console = Console(stderr=True) if not args.no_live else Console(file=io.StringIO())
    t = time.monotonic()
    try:
        result = run_bench(cfg, [*samplers, watch], console=console)
    except KeyboardInterrupt:
        if watch.reason is None:
            raise
        raise CbbenchError(
            f"{cfg.out_dir}: level stopped while finishing ({watch.reason})"
        ) from None
    s = result.summary
    return {
        "name": level.name,
        "load": level.describe(),
        "rate": None if level.rate is None or math.isinf(level.rate) else level.rate,
        "all_at_once": level.rate is not None and math.isinf(level.rate),
        "concurrency": level.concurrency,
        "request_throughput": s.get("request_throughput"),
        "output_throughput": s.get("output_throughput"),
        "ttft_p50_s": (s.get("ttft_s") or {}).get("p50"),
        "ttft_p99_s": (s.get("ttft_s") or {}).get("p99"),
        "completed": (s.get("counts") or {}).get("completed"),
        "requests": (s.get("counts") or {}).get("total"),
        "goodput_fraction": (s.get("goodput") or {}).get("fraction"),
        "stopped_early": watch.reason,
        "interrupted": result.interrupted and watch.reason is None,  # the user's Ctrl-C
        "wall_s": round(time.monotonic() - t, 3),
    }


def _write_index(out: Path, index: dict) -> None:
    tmp = out / (SWEEP_FILE + ".tmp")
    tmp.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out / SWEEP_FILE)


def saturation(levels: list[dict]) -> dict:
    """The highest offered rate the server sustained, and the most it ever delivered."""
    sustained = [
        lv["rate"]
        for lv in levels
        if lv["rate"]
        and not lv["stopped_early"]
        and (lv["request_throughput"] or 0) >= SUSTAINED * lv["rate"]
    ]
    peak = max((lv["request_throughput"] or 0 for lv in levels), default=0.0)
    return {"max_sustained_rate": max(sustained, default=None), "max_request_throughput": peak}


def _check(args: argparse.Namespace, out: Path) -> None:
    if (out / SWEEP_FILE).exists():
        raise CbbenchError(f"{out}: already holds a sweep; choose another --out")
    if args.num_requests < 1 or args.max_levels < 1 or args.level_timeout <= 0:
        raise CbbenchError("--num-requests, --max-levels and --level-timeout must be positive")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    _check(args, out)
    if args.find_max_rate:
        return find_max_rate(args, out)
    if args.rates:
        plan = [Level(f"rate-{r:g}", rate=r) for r in parse_list(args.rates, "--rates")]
    elif args.concurrency:
        plan = [
            Level(f"concurrency-{c}", concurrency=c)
            for c in parse_list(args.concurrency, "--concurrency", int)
        ]
    else:
        plan = [Level("sync", concurrency=1), Level("max", rate=math.inf)]
    if len(plan) > args.max_levels:
        raise CbbenchError(f"{len(plan)} levels, more than --max-levels {args.max_levels}")
    out.mkdir(parents=True, exist_ok=True)
    mode = "rates" if args.rates else "concurrency" if args.concurrency else "auto"
    index: dict = {
        "kind": "sweep",
        "mode": mode,
        "workload": args.workload,
        "runs": [],
        "levels": [],
    }
    status = "complete"
    try:
        i = 0
        while i < len(plan) and i < args.max_levels:
            level = plan[i]
            print(f"sweep level {i + 1}: {level.describe()}", file=sys.stderr)
            lv = run_level(args, level, out)
            index["runs"].append(level.name)
            index["levels"].append(lv)
            if lv["stopped_early"]:
                print(f"  stopped early: {lv['stopped_early']}", file=sys.stderr)
            _write_index(out, index)
            if lv["interrupted"]:
                raise KeyboardInterrupt  # stop the sweep; the level keeps what finished
            if mode == "auto" and level.name == "max":
                sync_rps = index["levels"][0]["request_throughput"] or 0.0
                rates = auto_rates(sync_rps, lv["request_throughput"] or 0.0, args.between)
                plan += [Level(f"rate-{r:.3g}", rate=float(f"{r:.3g}")) for r in rates]
            i += 1
    except KeyboardInterrupt:
        status = "interrupted"
    if mode == "auto":  # report order = load order: synchronous, rates, all at once
        rank = {"sync": -1.0, "max": math.inf}
        index["levels"].sort(key=lambda lv: rank.get(lv["name"], lv["rate"] or 0.0))
        index["runs"] = [lv["name"] for lv in index["levels"]]
    index["status"] = status
    index["saturation"] = saturation(index["levels"])
    _write_index(out, index)
    _print(index)
    print(f"sweep folder: {out}  (cbbench report {out})", file=sys.stderr)
    return 130 if status == "interrupted" else 0


def _print(index: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"cbbench sweep ({index['mode']}, {index['status']})")
    for col in ("level", "req/s", "output tok/s", "TTFT p50 (ms)", "TTFT p99 (ms)", "note"):
        t.add_column(col, justify="left" if col in ("level", "note") else "right")

    def ms(v):
        return "–" if v is None else f"{v * 1e3:.1f}"

    for lv in index["levels"]:
        t.add_row(
            lv["load"],
            "–" if lv["request_throughput"] is None else f"{lv['request_throughput']:.2f}",
            "–" if lv["output_throughput"] is None else f"{lv['output_throughput']:.1f}",
            ms(lv["ttft_p50_s"]),
            ms(lv["ttft_p99_s"]),
            lv["stopped_early"] or "",
        )
    Console(stderr=True).print(t)
    sat = index["saturation"]
    if sat["max_sustained_rate"] is not None:
        print(
            f"highest sustained rate {sat['max_sustained_rate']:g} req/s; "
            f"peak {sat['max_request_throughput']:.2f} req/s",
            file=sys.stderr,
        )


def find_max_rate(args: argparse.Namespace, out: Path) -> int:
    """--find-max-rate: the capacity search of harness.capacity, one run folder per trial."""
    from cbbench.harness.capacity import CapacityConfig, Trial
    from cbbench.harness.capacity import find_max_rate as search
    from cbbench.harness.summary import parse_slo

    if not parse_slo(args.slo):
        raise CbbenchError("--find-max-rate needs --slo, e.g. --slo ttft=200ms,tpot=50ms")
    cfg = CapacityConfig(
        goodput=args.goodput,
        start_rate=args.start_rate,
        max_rate=args.max_rate,
        min_rate=min(args.start_rate, 0.01),
        precision=args.precision,
        repeats=args.repeats,
        requests_per_level=args.num_requests,
        max_requests=args.max_requests,
        max_time_s=args.max_time,
    )
    cfg.validate()
    out.mkdir(parents=True, exist_ok=True)
    index: dict = {
        "kind": "sweep",
        "mode": "find-max-rate",
        "workload": args.workload,
        "slo": args.slo,
        "goodput": args.goodput,
        "runs": [],
        "levels": [],
    }

    def measure(rate: float, attempt: int) -> Trial:
        name = f"rate-{rate:.4g}" + (f"-repeat{attempt}" if attempt else "")
        print(
            f"capacity search: rate {rate:.4g}/s" + (f" (repeat {attempt})" if attempt else ""),
            file=sys.stderr,
        )
        level_args = argparse.Namespace(**{**vars(args), "seed": args.seed + attempt})
        lv = run_level(level_args, Level(name, rate=float(f"{rate:.4g}")), out)
        index["runs"].append(name)
        index["levels"].append(lv)
        _write_index(out, index)
        if lv["interrupted"]:
            raise KeyboardInterrupt
        good = lv["goodput_fraction"]
        if lv["stopped_early"]:
            good = 0.0  # clearly over-saturated: stopped before it finished
        print(f"  goodput {'–' if good is None else f'{good:.0%}'}", file=sys.stderr)
        return Trial(rate, attempt, good, lv["request_throughput"], lv["requests"] or 0, name)

    status = "complete"
    try:
        res = search(measure, cfg)
        index["capacity"] = res.to_dict()
    except KeyboardInterrupt:
        status = "interrupted"
    index["status"] = status
    index["saturation"] = saturation(index["levels"])
    _write_index(out, index)
    cap = index.get("capacity")
    if cap:
        lo, hi = cap["interval"]
        if lo is None:
            print(f"no rate met the SLO ({cap['stopped']})")
        else:
            upper = f"{hi:.3g}" if hi is not None else "?"
            print(
                f"max rate meeting {args.slo} for {args.goodput:.0%} of requests: {lo:.3g} req/s "
                f"(interval [{lo:.3g}, {upper}); {cap['stopped']}; {cap['requests']} requests, "
                f"{cap['wall_s']:.0f} s)"
            )
    print(f"sweep folder: {out}  (cbbench report {out})", file=sys.stderr)
    return 130 if status == "interrupted" else 0
