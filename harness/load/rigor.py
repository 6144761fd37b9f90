"""`cbbench bench` beyond one plain run: `--repeats N` into one folder (repeats.json: each
figure's mean, t-interval and CV), the over-saturation watch, and `--scenario mlperf-*`
(a Poisson schedule cut after its minimum duration, then the MLPerf verdict).

    code, folder = run_rigorous(cfg, RigorOptions(repeats=5), samplers_for)
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from cbbench.harness.conclusions import mlperf
from cbbench.harness.conclusions.repeats import CONFIDENCE, REPEATS_FILE, aggregate
from cbbench.harness.conclusions.saturation_watch import SaturationWatch
from cbbench.harness.conclusions.window import parse_window
from cbbench.harness.durations import parse_seconds
from cbbench.harness.errors import CbbenchError
from cbbench.harness.load.cache import flush_prefix_cache
from cbbench.harness.load.rigor_options import RigorOptions
from cbbench.harness.load.runner import BenchConfig, BenchResult, default_out_dir, run_bench
from cbbench.harness.results.outcome import exit_code

METHOD = (
    "Student's t-interval over the run means (each repeat's figure is one draw), "
    "CV = sample standard deviation / mean"
)


def _min_duration(rigor: RigorOptions) -> float:
    if rigor.min_duration:
        return parse_seconds(rigor.min_duration, "--min-duration")
    return mlperf.MIN_DURATION_S


def scenario_queries(rigor: RigorOptions, rate: float | None) -> int:
    """Queries to draw for `--scenario` at `rate` (apply_scenario then cuts the schedule)."""
    if rate is None:
        raise CbbenchError(f"--scenario {rigor.scenario}: give --rate (Poisson arrivals, req/s)")
    return mlperf.plan_queries(rate, _min_duration(rigor))


def apply_scenario(cfg: BenchConfig, rigor: RigorOptions) -> float:
    """Cut the workload's Poisson schedule after its first arrival at or past the minimum
    duration (and at least MIN_QUERY_COUNT queries); the minimum duration in seconds."""
    assert rigor.scenario is not None
    if rigor.model_class is None:
        raise CbbenchError(f"--scenario {rigor.scenario}: give --model-class")
    mlperf.limits(rigor.model_class, rigor.scenario)  # a class without the variant: one line
    min_d = _min_duration(rigor)
    reqs = cfg.workload.requests
    if not reqs or reqs[0].arrival_s is None:
        raise CbbenchError(f"--scenario {rigor.scenario}: give --rate (Poisson arrivals, req/s)")
    load = cfg.load or {}
    if load.get("arrival") == "constant" or load.get("burstiness") not in (None, 1.0):
        raise CbbenchError(
            f"--scenario {rigor.scenario}: MLPerf's queries arrive as a Poisson process; drop "
            "--arrival constant and --burstiness"
        )
    if cfg.concurrency is not None:
        raise CbbenchError(
            f"--scenario {rigor.scenario}: queries arrive open loop; drop --concurrency"
        )
    cut = next((i for i, r in enumerate(reqs) if r.arrival_s >= min_d), None)
    if cut is None:
        raise CbbenchError(
            f"--scenario {rigor.scenario}: the workload's {len(reqs)} queries end at "
            f"{reqs[-1].arrival_s:.0f} s, before the minimum duration {min_d:g} s"
        )
    keep = max(cut + 1, mlperf.MIN_QUERY_COUNT)
    cfg.workload = dataclasses.replace(cfg.workload, requests=reqs[:keep])
    cfg.load = {**cfg.load, "scenario": rigor.scenario, "model_class": rigor.model_class,
                "min_duration_s": min_d}  # fmt: skip
    return min_d


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _one(cfg: BenchConfig, rigor: RigorOptions, samplers_for: Callable, console) -> BenchResult:
    arrivals = [r.arrival_s for r in cfg.workload.requests]
    watch = SaturationWatch(arrivals if cfg.concurrency is None else None, rigor.on_saturation)
    result = run_bench(cfg, [*samplers_for(cfg), watch], console=console)  # None: its own
    if result.failure and not result.interrupted:
        print(f"cbbench bench: error: {result.failure}", file=sys.stderr)
    return result


def _mlperf(result: BenchResult, rigor: RigorOptions, min_d: float, console) -> bool:
    """The verdict, printed and kept in run.json; whether it is VALID."""
    assert rigor.scenario is not None and rigor.model_class is not None
    verdict = mlperf.judge(result.records, rigor.scenario, rigor.model_class, min_d)
    result.summary["mlperf"] = verdict.to_dict()  # type: ignore[typeddict-unknown-key]
    run_json = result.run_dir / "run.json"
    meta = json.loads(run_json.read_text(encoding="utf-8"))
    meta.setdefault("summary", {})["mlperf"] = verdict.to_dict()
    _write_json(run_json, meta)
    for line in verdict.lines():
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    return verdict.valid


def run_rigorous(
    cfg: BenchConfig, rigor: RigorOptions, samplers_for: Callable[[BenchConfig], list],
    console=None,
) -> tuple[int, Path]:  # fmt: skip
    """One run, or `rigor.repeats` of them into one folder: the exit code (the worst run's)
    and the run folder (the repeats folder)."""
    from rich.console import Console

    given = console  # run_bench's own default: the live view and notes on stderr
    console = console or Console()
    cfg.window = parse_window(rigor.window)
    if rigor.repeats < 1:
        raise CbbenchError(f"--repeats must be >= 1, got {rigor.repeats}")
    if (rigor.model_class or rigor.min_duration) and not rigor.scenario:
        raise CbbenchError("--model-class and --min-duration go with --scenario mlperf-server")
    min_d = apply_scenario(cfg, rigor) if rigor.scenario else None
    if rigor.repeats == 1:
        result = _one(cfg, rigor, samplers_for, given)
        code = exit_code(result.summary, result.interrupted, result.failure)
        if min_d is not None and not _mlperf(result, rigor, min_d, console) and code in (0, 3):
            code = mlperf.EXIT_INVALID
        return code, result.run_dir
    name = cfg.name or cfg.workload.short_name.replace("/", "_")
    out = Path(cfg.out_dir) if cfg.out_dir else default_out_dir(Path(name).name)
    if (out / REPEATS_FILE).exists() or (out / "requests.jsonl").exists():
        raise CbbenchError(f"{out}: already holds a run; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    index: dict = {"repeats": rigor.repeats, "runs": [], "method": METHOD,
                   "confidence": CONFIDENCE, "window": rigor.window, "reset": []}  # fmt: skip
    summaries, code = [], 0
    for i in range(1, rigor.repeats + 1):
        try:  # a fresh server state: its prefix cache emptied (vLLM, SGLang, the reference)
            index["reset"].append(flush_prefix_cache(cfg.base_url, cfg.api_key))
        except CbbenchError:
            index["reset"].append(None)  # the server offers no reset: the repeats share a cache
        one = dataclasses.replace(cfg, out_dir=out / f"repeat-{i}", name=f"{name}-repeat-{i}")
        console.print(f"repeat {i} of {rigor.repeats}", highlight=False)
        result = _one(one, rigor, samplers_for, given)
        if min_d is not None and not _mlperf(result, rigor, min_d, console):
            code = max(code, mlperf.EXIT_INVALID)
        index["runs"].append(f"repeat-{i}")
        run_code = exit_code(result.summary, result.interrupted, result.failure)
        code = max(code, run_code)
        if run_code in (0, 3):  # finished: its figures are one draw of the system
            summaries.append(dict(result.summary))
        else:  # Ctrl-C, failed or over-saturated: kept on disk, out of the intervals
            index.setdefault("excluded", []).append(f"repeat-{i}")
        index["aggregate"] = aggregate(summaries)
        _write_json(out / REPEATS_FILE, index)
        if run_code not in (0, 3):
            index["stopped_after"] = i
            _write_json(out / REPEATS_FILE, index)
            break
    for line in repeat_lines(index):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    console.print(f"repeats folder: {out}")
    return code, out


def repeat_lines(index: dict) -> list[str]:
    from cbbench.harness.conclusions.repeats import UNITS

    agg = index.get("aggregate") or {}
    n = len(index.get("runs", [])) - len(index.get("excluded", []))
    conf = f"{index.get('confidence', CONFIDENCE):.0%}"
    lines = [f"{n} repeats ({index.get('window')} figures): mean [{conf} t-interval] CV"]
    if None in index.get("reset", []):
        lines.append("  the server offers no prefix-cache reset: the repeats shared its cache")
    if index.get("excluded"):
        lines.append(
            f"  stopped after {', '.join(index['excluded'])} (failed, interrupted or "
            "over-saturated: kept on disk, not in the intervals)"
        )
    for key, iv in agg.items():
        scale, unit = (1e3, "ms") if UNITS[key] == "s" else (1.0, UNITS[key])
        if iv["n"] < 2:
            continue
        cv = "-" if iv["cv"] is None else f"{iv['cv']:.1%}"
        lines.append(
            f"  {key:<20} {iv['mean'] * scale:10.2f} {unit:<5} "
            f"[{iv['low'] * scale:.2f}, {iv['high'] * scale:.2f}]  CV {cv}"
        )
    return lines
