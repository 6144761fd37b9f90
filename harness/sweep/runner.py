"""`cbbench sweep` as a library call: one benchmark per load level into one folder (for
`cbbench report` curves); the SLO capacity search on a server is capacity_run.py.

    index = run_sweep(SweepOptions(base_url=..., out=Path(...), rates=[1, 2, 4]))

Levels are rates (open loop), concurrencies (closed loop), or auto (synchronous, all at once,
then rates in between); a level stops early when the server is clearly over-saturated.
Returns sweep.json's content (also written, after every level).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from cbbench.harness.errors import CbbenchError
from cbbench.harness.load.options import ClientOptions, LoadOptions, bench_config
from cbbench.harness.sweep.capacity_level import (
    SloWatch,
    judge_capacity_level,
    offered_rps,
    queue_bound,
)
from cbbench.harness.sweep.levels import Level, SaturationWatch, auto_rates
from cbbench.harness.sweep.verdict import SUSTAINED, judge_closed_level, judge_level, label
from cbbench.harness.telemetry import TelemetryOptions, build_samplers

SWEEP_FILE = "sweep.json"
SWEEP_TABLE = "sweep.md"  # print_sweep's table, as Markdown


@dataclass
class SweepOptions:
    base_url: str
    out: Path
    load: LoadOptions = field(default_factory=lambda: LoadOptions(num_requests=50, seed=0))
    client: ClientOptions = field(default_factory=ClientOptions)
    telemetry: TelemetryOptions = field(default_factory=TelemetryOptions)
    rates: list[float] | None = None  # open-loop levels
    concurrency: list[int] | None = None  # closed-loop levels
    find_max_rate: bool = False  # else neither rates nor concurrency: auto
    between: int = 4  # auto: rates in between
    level_timeout_s: float = 300.0
    max_levels: int = 12
    live: bool = True
    command: list[str] = field(default_factory=list)
    # capacity search (find_max_rate)
    goodput: float = 0.95
    start_rate: float = 1.0
    max_rate: float = 1000.0
    precision: float = 0.1
    repeats: int = 3  # capacity.REPEAT_RULE
    max_requests: int = 2000
    max_time_s: float = 1800.0

    @property
    def mode(self) -> str:
        if self.find_max_rate:
            return "find-max-rate"
        return "rates" if self.rates else "concurrency" if self.concurrency else "auto"


def run_level(
    opts: SweepOptions,
    level: Level,
    seed_offset: int = 0,
    num_requests: int | None = None,
    capacity: tuple[dict, float] | None = None,
) -> dict:
    """One level: a bench run into OUT/<level name>; its row of sweep.json. `capacity`:
    (SLO, goodput) of the capacity search: the level is watched and judged by the SLO
    (capacity_level.py) rather than by the over-saturation watch."""
    from cbbench.harness.load.runner import run_bench
    from rich.console import Console

    load = dataclasses.replace(
        opts.load, rate=level.rate, concurrency=level.concurrency, duration=None,
        seed=(opts.load.seed or 0) + seed_offset,
        num_requests=num_requests or opts.load.num_requests,
    )  # fmt: skip
    name = f"{Path(str(opts.load.workload)).name}-{level.name}"
    cfg = bench_config(
        opts.base_url, load, opts.client, out_dir=str(opts.out / level.name), name=name,
        live=opts.live, command=opts.command,
    )  # fmt: skip
    cfg.load = {**cfg.load, "sweep_level": level.name}
    samplers = list(build_samplers(opts.telemetry, cfg.base_url))
    planned = len(cfg.workload)
    if capacity is not None:
        watch = SloWatch(Path(cfg.out_dir), capacity[0], planned, capacity[1], opts.level_timeout_s)
    else:
        watch = SaturationWatch(Path(cfg.out_dir), planned, opts.level_timeout_s)
    console = Console(stderr=True) if opts.live else Console(file=io.StringIO())
    t = time.monotonic()
    try:
        result = run_bench(cfg, [*samplers, watch], console=console)
    except KeyboardInterrupt:
        if watch.stop_reason is None:
            raise
        raise CbbenchError(
            f"{cfg.out_dir}: level stopped while finishing ({watch.stop_reason})"
        ) from None
    s = result.summary
    open_loop = level.rate is not None and not math.isinf(level.rate)
    if open_loop:
        bound = queue_bound(capacity[0]) if capacity is not None else None
        verdict = judge_level(result.records, level.rate, bound)
    elif level.concurrency is not None:
        verdict = judge_closed_level(result.records, level.concurrency)
    else:
        verdict = None
    if verdict is not None:  # one line, the table's and sweep.json's (verdict.label)
        if watch.stop_reason or result.interrupted:  # the stop decides, not the length
            verdict.too_short = verdict.needed_requests = None
            verdict.sustained = False if watch.stop_reason else None
        verdict.reason = label(verdict, watch.stop_reason, result.interrupted)
    judged = None
    if capacity is not None and open_loop:
        judged = judge_capacity_level(
            result.records, level.rate, capacity[0], capacity[1], planned, watch.stop_reason,
            (s.get("client") or {}).get("timing_bound_s"),
        ).to_dict()
    return {
        "name": level.name,
        "load": level.describe(),
        "rate": None if level.rate is None or math.isinf(level.rate) else level.rate,
        "all_at_once": level.rate is not None and math.isinf(level.rate),
        "concurrency": level.concurrency,
        "offered_rps": offered_rps(result.records) if open_loop else None,  # sent/send span
        "request_throughput": s.get("request_throughput"),
        "output_throughput": s.get("output_throughput"),
        "ttft_p50_s": (s.get("ttft_s") or {}).get("p50"),
        "ttft_p99_s": (s.get("ttft_s") or {}).get("p99"),
        "ttfo_p50_s": (s.get("ttfo_s") or {}).get("p50"),  # first answer token
        "ttfo_p99_s": (s.get("ttfo_s") or {}).get("p99"),
        "reasoning_tokens": s.get("total_reasoning_tokens"),
        "completed": (s.get("counts") or {}).get("completed"),
        "requests": (s.get("counts") or {}).get("total"),
        "goodput_fraction": (s.get("goodput") or {}).get("fraction"),
        "stopped_early": watch.stop_reason,
        "verdict": None if verdict is None else verdict.to_dict(),
        "capacity": judged,  # the capacity search's judgement of the level
        "interrupted": result.interrupted,  # the user's Ctrl-C (a watch's stop is not)
        "wall_s": round(time.monotonic() - t, 3),
    }


def _write_index(out: Path, index: dict) -> None:
    tmp = out / (SWEEP_FILE + ".tmp")
    tmp.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out / SWEEP_FILE)


def _sustained(lv: dict) -> bool | None:
    """A rate level's verdict (harness/sweep/verdict.py): True, False, or None when it was
    too short to judge. Rows written before verdicts fall back to completed / window."""
    if lv.get("stopped_early"):
        return False
    if lv.get("interrupted"):
        return None
    if lv.get("verdict") is not None:
        return lv["verdict"]["sustained"]
    return (lv.get("request_throughput") or 0) >= SUSTAINED * lv["rate"]


def saturation(levels: list[dict]) -> dict:
    """The highest offered rate the server sustained (levels too short to judge count for
    nothing), the most it ever delivered, and the levels that were too short to judge."""
    rated = [lv for lv in levels if lv.get("rate")]
    sustained = [lv["rate"] for lv in rated if _sustained(lv)]
    unjudged = [lv["name"] for lv in rated if _sustained(lv) is None]
    peak = max((lv["request_throughput"] or 0 for lv in levels), default=0.0)
    return {
        "max_sustained_rate": max(sustained, default=None),
        "max_request_throughput": peak,
        "too_short": unjudged,
    }


def _check(opts: SweepOptions) -> None:
    if (opts.out / SWEEP_FILE).exists():
        raise CbbenchError(f"{opts.out}: already holds a sweep; choose another --out")
    n = opts.load.num_requests
    if n is None or n < 1 or opts.max_levels < 1 or opts.level_timeout_s <= 0:
        raise CbbenchError("--num-requests, --max-levels and --level-timeout must be positive")


def run_sweep(opts: SweepOptions) -> dict:
    """Every level in turn; returns sweep.json's content, whose
    "status" says whether Ctrl-C stopped it (finished levels are kept)."""
    _check(opts)
    out = opts.out
    if opts.find_max_rate:
        raise CbbenchError("the capacity search is capacity_run.find_max_rate, not run_sweep")
    if opts.rates:
        plan = [Level(f"rate-{r:g}", rate=r) for r in opts.rates]
    elif opts.concurrency:
        plan = [Level(f"concurrency-{c}", concurrency=c) for c in opts.concurrency]
    else:
        plan = [Level("sync", concurrency=1), Level("max", rate=math.inf)]
    if len(plan) > opts.max_levels:
        raise CbbenchError(f"{len(plan)} levels, more than --max-levels {opts.max_levels}")
    out.mkdir(parents=True, exist_ok=True)
    mode = opts.mode
    index: dict = {
        "kind": "sweep",
        "mode": mode,
        "workload": opts.load.workload,
        "runs": [],
        "levels": [],
    }
    status = "complete"
    try:
        i = 0
        while i < len(plan) and i < opts.max_levels:
            level = plan[i]
            print(f"sweep level {i + 1}: {level.describe()}", file=sys.stderr)
            lv = run_level(opts, level)
            index["runs"].append(level.name)
            index["levels"].append(lv)
            if lv["stopped_early"]:
                print(f"  stopped early: {lv['stopped_early']}", file=sys.stderr)
            _write_index(out, index)
            if lv["interrupted"]:
                raise KeyboardInterrupt  # stop the sweep; the level keeps what finished
            if mode == "auto" and level.name == "max":
                sync_rps = index["levels"][0]["request_throughput"] or 0.0
                rates = auto_rates(sync_rps, lv["request_throughput"] or 0.0, opts.between)
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
    return index


def _verdict_cell(lv: dict) -> str:
    """The level's verdict as sweep.json states it (verdict.label: one source for both); a
    capacity level's met/missed/undecided and why (capacity_level.py)."""
    cap = lv.get("capacity")
    if cap:
        return f"{cap['state']}: {cap['why']}"
    v = lv.get("verdict") or {}
    if v.get("reason"):
        return v["reason"]
    if lv.get("rate") is None:  # rows written before reasons
        return f"too short to judge (needs {v.get('needed_requests')} requests)" if v.get(
            "too_short") else ""  # fmt: skip
    ok = _sustained(lv)
    return "too short to judge" if ok is None else "sustained" if ok else "not sustained"


def print_sweep(index: dict, folder: Path | None = None) -> Path | None:
    """The levels' table and verdict on stdout (Markdown when stdout is not a terminal: names
    whole), also written as Markdown into `folder` (SWEEP_TABLE) when given; returns that
    file."""
    from cbbench.harness.results.compare import emit_table
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"cbbench sweep ({index['mode']}, {index['status']})")
    reasoned = any(lv.get("reasoning_tokens") for lv in index["levels"])
    ttfo_cols = ("TTFO p50 (ms)", "TTFO p99 (ms)") if reasoned else ()
    slo = any(lv.get("goodput_fraction") is not None for lv in index["levels"])
    good_cols = ("goodput",) if slo else ()  # the share of requests meeting --slo
    cols = ("level", "req/s", "output tok/s", *good_cols, "TTFT p50 (ms)", "TTFT p99 (ms)",
            *ttfo_cols)  # fmt: skip
    for col in (*cols, "verdict", "note"):
        t.add_column(col, justify="left" if col in ("level", "verdict", "note") else "right")

    def ms(v):
        return "–" if v is None else f"{v * 1e3:.1f}"

    def pct(v):
        return "–" if v is None else f"{v:.0%}"

    for lv in index["levels"]:
        t.add_row(
            lv["load"],
            "–" if lv["request_throughput"] is None else f"{lv['request_throughput']:.2f}",
            "–" if lv["output_throughput"] is None else f"{lv['output_throughput']:.1f}",
            *((pct(lv.get("goodput_fraction")),) if slo else ()),
            ms(lv["ttft_p50_s"]),
            ms(lv["ttft_p99_s"]),
            *((ms(lv.get("ttfo_p50_s")), ms(lv.get("ttfo_p99_s"))) if reasoned else ()),
            cell := _verdict_cell(lv),
            "interrupted (Ctrl-C)" if lv.get("interrupted")
            else "" if (lv["stopped_early"] or "") in cell else lv["stopped_early"],
        )
    path = emit_table(Console(), t, folder, SWEEP_TABLE)
    sat = index["saturation"]
    for lv in index["levels"]:
        why = (lv.get("verdict") or {}).get("too_short")
        if why and not lv.get("stopped_early") and not lv.get("interrupted"):
            print(f"{lv['load']}: {why}")
    if sat["max_sustained_rate"] is not None:
        print(
            f"highest sustained rate {sat['max_sustained_rate']:g} req/s; "
            f"peak {sat['max_request_throughput']:.2f} req/s"
            + (" (higher levels too short to judge)" if _judged_below(index) else "")
        )
    elif any(lv.get("rate") for lv in index["levels"]):
        print("no rate level was judged sustained")
    return path


def _judged_below(index: dict) -> bool:
    """Whether a level above the highest sustained rate was too short to judge."""
    top = index["saturation"]["max_sustained_rate"]
    return any(
        lv.get("rate") and lv["rate"] > top and _sustained(lv) is None for lv in index["levels"]
    )
