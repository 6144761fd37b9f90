"""`cbbench sweep --find-max-rate` on a server: the capacity search of capacity.py, one run
folder per trial (runner.run_level), each level watched and judged by the SLO
(capacity_level.py); sweep.json's `capacity` and the lines that print it."""

from __future__ import annotations

import sys

from cbbench.harness.errors import CbbenchError
from cbbench.harness.sweep.levels import Level
from cbbench.harness.sweep.runner import (
    SweepOptions,
    _check,
    _write_index,
    run_level,
    saturation,
)


def find_max_rate(opts: SweepOptions) -> dict:
    """--find-max-rate: the capacity search of harness.capacity, one run folder per trial."""
    from cbbench.harness.results.summary import parse_slo
    from cbbench.harness.sweep.capacity import CapacityConfig, Trial
    from cbbench.harness.sweep.capacity import find_max_rate as search
    from cbbench.harness.sweep.capacity_level import queue_bound

    _check(opts)
    out = opts.out
    slo = opts.client.slo
    if not parse_slo(slo):
        raise CbbenchError("--find-max-rate needs --slo, e.g. --slo ttft=200ms,tpot=50ms")
    cfg = CapacityConfig(
        goodput=opts.goodput,
        start_rate=opts.start_rate,
        max_rate=opts.max_rate,
        min_rate=min(opts.start_rate, 0.01),
        precision=opts.precision,
        repeats=opts.repeats,
        requests_per_level=opts.load.num_requests,
        max_requests=opts.max_requests,
        max_time_s=opts.max_time_s,
        queue_bound_s=queue_bound(parse_slo(slo)),
    )
    cfg.validate()
    out.mkdir(parents=True, exist_ok=True)
    index: dict = {
        "kind": "sweep",
        "mode": "find-max-rate",
        "workload": opts.load.workload,
        "slo": slo,
        "goodput": opts.goodput,
        "repeats": opts.repeats,
        "runs": [],
        "levels": [],
    }

    slo_s = parse_slo(slo)

    def measure(rate: float, attempt: int, n: int) -> Trial:
        name = f"rate-{rate:.4g}" + (f"-repeat{attempt}" if attempt else "")
        name += f"-n{n}" if n != opts.load.num_requests else ""  # lengthened to be judged
        print(
            f"capacity search: rate {rate:.4g}/s, {n} requests"
            + (f" (repeat {attempt})" if attempt else ""),
            file=sys.stderr,
        )
        lv = run_level(
            opts, Level(name, rate=float(f"{rate:.4g}")), seed_offset=attempt, num_requests=n,
            capacity=(slo_s, opts.goodput),
        )  # fmt: skip
        index["runs"].append(name)
        index["levels"].append(lv)
        _write_index(out, index)
        if lv["interrupted"]:
            raise KeyboardInterrupt
        judged = lv["capacity"] or {}
        good = judged.get("goodput_fraction", lv["goodput_fraction"])  # of what finished
        served = (lv.get("verdict") or {}).get("achieved_rps")  # verdict.py's served rate
        if served is None:
            served = lv["request_throughput"]
        trial = Trial(
            rate, attempt, good, served, lv["requests"] or 0, name,
            state=judged.get("state"), why=judged.get("why", ""),
            needed_requests=judged.get("needed_requests"), offered_rps=lv.get("offered_rps"),
            timing_note=judged.get("timing_note"),
        )  # fmt: skip
        stop = f"; stopped: {lv['stopped_early']}" if lv["stopped_early"] else ""
        state = (trial.meets(opts.goodput) and trial.short_offer()) or judged.get("state", "?")
        print(
            f"  {state}: {judged.get('why', '')}; goodput "
            f"{'–' if good is None else f'{good:.0%}'} of the finished{stop}",
            file=sys.stderr,
        )
        return trial

    status = "complete"
    try:
        res = search(measure, cfg)
        index["capacity"] = res.to_dict()
        if res.undecided:  # it ended "cannot decide": not a complete answer
            status = "undecided"
    except KeyboardInterrupt:
        status = "interrupted"
    index["status"] = status
    index["saturation"] = saturation(index["levels"])
    _write_index(out, index)
    return index


def print_capacity(index: dict) -> None:
    from cbbench.harness.conclusions.capacity_answer import capacity_lines

    for line in capacity_lines(index):
        print(line)
