"""`cbbench workload`: list presets, show a workload's statistics, convert it to native JSONL."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
from cbbench.harness.cli.parsing import old_spelling
from cbbench.harness.errors import CbbenchError
from cbbench.workloads import (
    ARRIVAL_KINDS,
    PRESETS,
    Workload,
    load_workload,
    summarize_big,
    summarize_workload,
    with_arrivals,
    write_native_jsonl,
)
from cbbench.workloads.graph import graph_lines
from rich.console import Console
from rich.table import Table

BAR_WIDTH = 40


def _shape_of_cv(cv: float) -> float:
    """The old --cv (coefficient of variation of the gaps) as a gamma shape: CV = 1/sqrt(k)."""
    return 1.0 / (cv * cv) if cv > 0 else float("inf")


def _cv_of_shape(shape: float) -> float:
    if not shape > 0:
        raise CbbenchError(f"--burstiness must be > 0, got {shape:g}")
    return 1.0 / math.sqrt(shape)


def _add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC", help="preset name, trace file or TOML/JSON spec file")
    p.add_argument("--seed", type=int, default=None, help="seed (default: the spec's, else 0)")
    p.add_argument(
        "--num-requests", type=int, default=None, help="take the first N requests of the stream"
    )
    p.add_argument("--tokenizer", default=None, help="tokenizer.json to count ShareGPT tokens")
    p.add_argument(
        "--arrival",
        choices=ARRIVAL_KINDS,
        default=None,
        help="replace the arrival times (default: keep the spec's)",
    )
    p.add_argument("--rate", type=float, default=None, help="requests/s for constant/poisson/gamma")
    p.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma arrivals' shape as bench's --burstiness (vLLM's): 1 = Poisson, < 1 "
        "burstier (default 1)",
    )
    old_spelling(p, "--cv", "--burstiness", convert=_shape_of_cv)
    p.add_argument("--time-scale", type=float, default=1.0, help="replay: 2 = twice as fast")
    p.add_argument("--target-rate", type=float, default=None, help="replay: rescale to this req/s")
    p.add_argument("--ramp-up", type=float, default=0.0, help="seconds to ramp the rate up from 0")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("workload", help="list, show and convert workloads (presets, traces, specs)")
    wsub = p.add_subparsers(dest="workload_command", metavar="ACTION", required=True)
    wsub.add_parser("list", help="list the named presets")
    show = wsub.add_parser("show", help="summary statistics and an output-length histogram")
    _add_spec_args(show)
    show.add_argument("--bins", type=int, default=16, help="histogram bins (default 16)")
    show.add_argument("--json", action="store_true", help="print the summary as JSON")
    conv = wsub.add_parser("convert", help="write any supported workload as native JSONL")
    _add_spec_args(conv)
    conv.add_argument("-o", "--output", required=True, help="output .jsonl path")
    p.set_defaults(func=run)


def arrival_kind(args: argparse.Namespace) -> str | None:
    """The --arrival the flags ask for: --time-scale or --target-rate alone means replay. A flag
    the kind would not use is an error naming it (it was silently ignored: a "replay 20x faster"
    convert wrote the trace's own times)."""
    used = {
        "--rate": args.rate is not None,
        "--burstiness": args.burstiness != 1.0,
        "--time-scale": args.time_scale != 1.0,
        "--target-rate": args.target_rate is not None,
        "--ramp-up": args.ramp_up != 0.0,
    }
    kind = args.arrival
    if kind is None and (used["--time-scale"] or used["--target-rate"]):
        kind = "replay"
    takes = {
        None: (),
        "all-at-once": (),
        "constant": ("--rate", "--ramp-up"),
        "poisson": ("--rate", "--ramp-up"),
        "gamma": ("--rate", "--burstiness", "--ramp-up"),
        "replay": ("--time-scale", "--target-rate", "--ramp-up"),
    }[kind]
    for flag, given in used.items():
        if given and flag not in takes:
            what = f"--arrival {kind}" if kind else "no --arrival (the spec's own times are kept)"
            hint = f"; it needs --arrival {_NEEDS[flag]}" if flag in _NEEDS else ""
            raise CbbenchError(f"{flag} has no effect with {what}{hint}")
    return kind


_NEEDS = {
    "--rate": "constant, poisson or gamma",
    "--burstiness": "gamma",
    "--ramp-up": "constant, poisson, gamma or replay",
    "--time-scale": "replay",
    "--target-rate": "replay",
}


def load_from_args(args: argparse.Namespace) -> Workload:
    wl = load_workload(args.spec, args.seed, args.num_requests, args.tokenizer)
    kind = arrival_kind(args)
    if kind is not None:
        wl = with_arrivals(
            wl,
            kind,
            rate=args.rate,
            cv=_cv_of_shape(args.burstiness),
            seed=wl.seed,
            time_scale=args.time_scale,
            target_rate=args.target_rate,
            ramp_up_s=args.ramp_up,
        )
    return wl


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def stats_table(summary: dict) -> Table:
    table = Table(title=f"workload {summary['name']} (seed {summary['seed']})")
    table.add_column("tokens")
    for col in ("mean", "p50", "p90", "p99", "max"):
        table.add_column(col, justify="right")
    for label, key in (("prompt", "prompt_len"), ("output", "output_len")):
        d = summary[key]
        if d["count"]:
            table.add_row(
                label, *(_fmt(d[c]) for c in ("mean", "p50", "p90", "p99")), f"{d['max']:,}"
            )
    return table


def histogram(values: np.ndarray, bins: int, weights: np.ndarray | None = None) -> Table:
    """Integer-aligned bins: each row covers lengths lo..hi inclusive, all rows equally wide.
    `weights`: how many times each of `values` occurred (a streamed summary's counts)."""
    table = Table(title="output length histogram", show_header=True, box=None)
    table.add_column("tokens", justify="right")
    table.add_column("count", justify="right")
    table.add_column("")
    if not len(values):
        return table
    lo, hi = int(values.min()), int(values.max())
    width = -(-(hi - lo + 1) // max(1, bins))
    counts = np.bincount((values - lo) // width, weights=weights).astype(np.int64)
    peak = max(int(counts.max()), 1)
    for i, c in enumerate(counts.tolist()):
        start = lo + i * width
        label = f"{start:,}" if width == 1 else f"{start:,}-{min(start + width - 1, hi):,}"
        table.add_row(label, f"{c:,}", "█" * round(BAR_WIDTH * c / peak))
    return table


def run_show(args: argparse.Namespace) -> int:
    big = None
    if arrival_kind(args) is None and args.tokenizer is None:
        big = summarize_big(args.spec, args.seed, args.num_requests)
    if big is not None:  # streamed in bounded memory, never built
        summary, output_counts = big
        values, weights = output_counts.values, output_counts.counts
    else:
        wl = load_from_args(args)
        summary = summarize_workload(wl)
        values, weights = np.asarray([r.output_len for r in wl.requests]), None
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"requests: {summary['count']:,}")
    if not summary["count"]:
        return 0
    console.print(stats_table(summary))
    if summary["open_loop"]:
        cv = summary["burstiness"]
        # bench's --burstiness is the gamma shape K = 1/CV^2 (vLLM's), not this CV: Mooncake's
        # CV 3.03 read as "--burstiness 3.03" replays it smoother than Poisson (CV 0.57)
        shape = f" = --burstiness {1 / (cv * cv):.3g} (gamma shape 1/CV²)" if cv else ""
        console.print(
            f"duration: {_fmt(summary['duration_s'])} s   mean rate: "
            f"{_fmt(summary['mean_rate'], 3)} req/s   CV of gaps: {_fmt(cv, 3)}{shape}"
        )
    else:
        console.print("arrivals: none (closed loop; all at once)")
    skipped = summary["rows_skipped"]
    console.print(
        "rows skipped: " + (", ".join(f"{k} {v:,}" for k, v in skipped.items()) if skipped else "0")
    )
    if "with_prefix_ids" in summary:
        console.print(f"requests with prefix ids: {summary['with_prefix_ids']:,}")
    if "intended_hit_rate" in summary:
        rate = summary["intended_hit_rate"]
        console.print(
            f"intended prefix-cache hit rate: {100 * rate['primed']:.1f} % primed (--prime), "
            f"{100 * rate['cold']:.1f} % cold"
        )
    if "sessions" in summary:
        ss = summary["sessions"]
        think = "" if ss["think_s_p50"] is None else f", think time p50 {ss['think_s_p50']:g} s"
        console.print(
            f"sessions: {ss['count']:,} ({ss['multi_turn']:,} multi-turn), turns p50 "
            f"{ss['turns']['p50']:g}, max {ss['turns']['max']}{think}"
        )
    if big is None:
        for line in graph_lines(wl.requests):  # agent graphs: each session's calls
            console.print(line, markup=False, soft_wrap=True)
    console.print(histogram(values, args.bins, weights))
    return 0


def run_convert(args: argparse.Namespace) -> int:
    wl = load_from_args(args)
    write_native_jsonl(wl, args.output)
    print(f"wrote {len(wl):,} requests to {args.output}")
    return 0


def run_list(args: argparse.Namespace) -> int:
    table = Table(title="workload presets")
    for col in ("name", "requests", "arrivals", "description"):
        table.add_column(col)
    for p in PRESETS.values():
        count = p.default_count
        table.add_row(
            p.name,
            "all rows" if count is None else str(count),
            "trace timestamps" if p.has_arrivals else "none (all at once)",
            p.description,
        )
    Console(soft_wrap=True).print(table)
    return 0


ACTIONS = {"list": run_list, "show": run_show, "convert": run_convert}


def run(args: argparse.Namespace) -> int:
    return ACTIONS[args.workload_command](args)
