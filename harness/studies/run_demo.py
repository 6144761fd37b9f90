"""`cbbench run`, as a library call: the same workload once per scheduler, measured (a real
`cbbench serve` per scheduler, load over HTTP, telemetry on) or simulated (the in-process
replay of `harness.studies.simulation` on a modelled device).

Same model, same KV pool, same B (static batch size = dynamic max batch size = continuous
max_num_seqs), same requests: only the batching policy changes. With more than one KV-cache
dtype (`kv_cache_dtypes`), every scheduler runs once per dtype with the same
`--kv-cache-memory-gb`: "continuous" (auto) beside "continuous+int8", and the table shows each
run's pool, capacity, running sequences and preemptions.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cbbench.harness.errors import CbbenchError
from cbbench.harness.results.compare import kv_pool
from cbbench.harness.results.summary import RunSummary, parse_slo
from cbbench.harness.studies.run_demo_after import remove_if_only_workload, timing_note
from cbbench.reference_engine.config.engine_config import KV_CACHE_DTYPES, SCHEDULERS
from cbbench.reference_engine.config.options import FLAGS, SIM_DEFAULTS, engine_argv
from cbbench.workloads.presets import PRESETS, preset_settings
from rich.console import Console

DEFAULT_SLO = "ttft=10s,tpot=100ms"
# each fresh server gets one unmeasured request first (bench --warmup 1): a cold engine's first
# steps are slower, and a short run is decided by its first requests (seed-demo read TPOT p50
# 0.0 ms before the API process loaded anyio's backend at start: tokens in one burst)
RUN_WARMUP = 1
# The default workload: mixed output lengths (the case continuous batching is for), sized so
# that all three schedulers finish in about two minutes on 2 CPU cores with the tiny model.
RUN_WORKLOAD: dict = {
    "name": "run-demo",
    "description": PRESETS["run-demo"].description,
    **PRESETS["run-demo"].spec,
}
# Fewer requests than this many batches of B cannot show the schedulers apart: the first
# batch's start and the last one's drain are then a large share of the run, and static's
# ragged batch ends (what continuous batching removes) happen only a few times. Measured on
# the tiny model, a loaded 2-core host, B=8: 48 and 128 requests put static ahead on output
# tok/s (continuous 0.76x, 0.88x); the default 256 (32 batches) showed continuous 1.70x.
MIN_BATCHES_TO_COMPARE = 32


@dataclass
class RunOptions:
    """One `cbbench run`."""

    schedulers: list[str] = field(default_factory=lambda: list(SCHEDULERS))
    engine: dict[str, Any] = field(default_factory=dict)  # engine settings given (flag dests)
    # two or more: each scheduler once per KV dtype; else engine["kv_cache_dtype"] (if given)
    kv_cache_dtypes: list[str] = field(default_factory=list)
    workload: str | None = None  # None: RUN_WORKLOAD, written into the parent folder
    num_requests: int | None = None
    seed: int = 0  # workload and engine seed
    concurrency: int | None = None  # closed loop; None: all at once
    rate: float | None = None  # open loop: Poisson arrivals at this rate (req/s)
    slo: str = DEFAULT_SLO
    temperature: float | None = None  # sent with every request; None: the server's default
    sim: str | None = None  # hardware: simulate instead of serving
    out: Path | None = None  # parent folder; None: results/runs/<time>-run
    report: bool = True
    live: bool = True
    command: list[str] = field(default_factory=list)

    def check(self) -> None:
        for flag, v in (
            ("--batch-size", self.engine.get("batch_size")),
            ("--num-requests", self.num_requests),
            ("--concurrency", self.concurrency),
        ):
            if v is not None and v < 1:
                raise CbbenchError(f"{flag} must be >= 1, got {v}")
        if self.rate is not None and self.rate <= 0:
            raise CbbenchError(f"--rate must be > 0, got {self.rate}")
        if self.temperature is not None and self.temperature < 0:
            raise CbbenchError(f"--temperature must be >= 0, got {self.temperature}")
        if self.engine.get("speculative_method") is not None and (
            "continuous" not in self.schedulers
        ):
            raise CbbenchError(
                "speculative decoding runs with the continuous scheduler only: add it to "
                "--schedulers"
            )
        bad = [d for d in self.kv_cache_dtypes if d not in KV_CACHE_DTYPES]
        if bad:
            raise CbbenchError(
                f"--kv-cache-dtype: unknown {', '.join(bad)} (choose from "
                f"{', '.join(KV_CACHE_DTYPES)})"
            )
        parse_slo(self.slo)


@dataclass
class RunDemoResult:
    parent: Path
    run_dirs: list[Path]
    summaries: dict[str, RunSummary]  # measured runs: scheduler -> run summary
    interrupted: bool
    device: str = "sim"
    report: Path | None = None
    caution: str | None = None  # too few requests to show the schedulers apart


def too_few_requests(n: int, batch_size: int, schedulers: list[str]) -> str | None:
    """A caution when `n` requests are too few to compare the schedulers at B=`batch_size`."""
    need = MIN_BATCHES_TO_COMPARE * batch_size
    if n >= need or len(schedulers) < 2:
        return None
    return (
        f"{n} requests are {n / batch_size:g} batches of B={batch_size}: too few to show the "
        f"schedulers apart (start-up and the last batch's drain dominate, and static's ragged "
        f"batch ends occur only a few times); differences here may reverse with more "
        f"requests: use --num-requests {need} or more ({MIN_BATCHES_TO_COMPARE} batches)"
    )


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def parent_dir(out: Path | None) -> Path:
    if out is not None:
        parent = Path(out)
    else:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        parent = Path("results") / "runs" / f"{stamp}-run"
    if parent.exists() and any(parent.iterdir()):
        raise CbbenchError(f"--out {parent}: not empty; choose another folder")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CbbenchError(f"--out {parent}: cannot create ({exc.strerror})") from None
    return parent


def workload_spec(opts: RunOptions, parent: Path) -> str:
    """The workload as a spec string: the default one is written next to the runs."""
    if opts.workload:
        return opts.workload
    path = parent / "workload.json"
    path.write_text(json.dumps(RUN_WORKLOAD, indent=2) + "\n", encoding="utf-8")
    return str(path)


SPEC_NAME = "continuous+spec"
SPEC_DESTS = tuple(d for d, f in FLAGS.items() if f.section == "speculative")


@dataclass(frozen=True)
class Variant:
    """One server (or replay) of a run: its name, scheduler, speculation, KV dtype."""

    name: str
    scheduler: str
    spec: bool = False
    kv_cache_dtype: str | None = None  # None: the engine setting given (or its default)


def dtype_label(name: str, kv_cache_dtype: str | None) -> str:
    """The run's name: the plain name for auto (the model dtype) or for a single dtype per
    run, `name+dtype` (e.g. continuous+int8) otherwise."""
    return name if kv_cache_dtype in (None, "auto") else f"{name}+{kv_cache_dtype}"


def variants(opts: RunOptions) -> list[Variant]:
    """One per scheduler, and per KV dtype when several are given (same scheduler side by
    side); with a speculative method given, "continuous+spec" runs right after plain
    "continuous" (speculation applies to the continuous scheduler only): with and without it
    on the same workload."""
    spec = opts.engine.get("speculative_method") is not None
    dtypes: list[str | None] = (
        list(opts.kv_cache_dtypes) if len(opts.kv_cache_dtypes) > 1 else [None]
    )
    out = []
    for name in opts.schedulers:
        runs = [(name, False)] + ([(SPEC_NAME, True)] if spec and name == "continuous" else [])
        for base, is_spec in runs:
            for d in dtypes:
                out.append(Variant(dtype_label(base, d), name, is_spec, d))
    assert len({v.name for v in out}) == len(out), "run names are unique"
    return out


def serve_settings(opts: RunOptions, scheduler: str, run: Variant | None = None) -> dict[str, Any]:
    """The engine settings one server gets: every setting given, plus the seed; the
    speculative ones only for a speculative variant; the variant's KV dtype."""
    skip = {"model", "device", "scheduler"}
    if run is None or not run.spec:
        skip |= set(SPEC_DESTS)
    out = {k: v for k, v in opts.engine.items() if k not in skip}
    if run is not None and run.kv_cache_dtype is not None:
        out["kv_cache_dtype"] = run.kv_cache_dtype
    # B, also the dynamic/continuous size unless given: the preset's own (seed-demo: 4), else 8
    out.setdefault("batch_size", preset_settings(opts.workload or "").get("batch_size", 8))
    if scheduler != "static":
        out.pop("drain_timeout", None)
    out["seed"] = opts.seed
    return out


def run_demo(opts: RunOptions, console: Console | None = None) -> RunDemoResult:
    """Every scheduler in turn; then the HTML report over their run folders."""
    console = console or Console(soft_wrap=True)
    opts.check()
    if opts.workload:  # a bad spec fails before any folder is made
        from cbbench.workloads import load_workload

        if not load_workload(opts.workload, seed=opts.seed, num_requests=opts.num_requests):
            raise CbbenchError(f"--workload {opts.workload}: no requests")  # no servers to start
    existed = opts.out is not None and Path(opts.out).exists()
    parent = parent_dir(opts.out)
    try:
        return _run_in(opts, parent, console)
    except BaseException:
        if not existed:  # a run that failed before any run folder: no folder left behind
            remove_if_only_workload(parent)
        raise


def _run_in(opts: RunOptions, parent: Path, console: Console) -> RunDemoResult:
    spec = workload_spec(opts, parent)
    from cbbench.workloads import load_workload

    n = len(load_workload(spec, seed=opts.seed, num_requests=opts.num_requests))
    b = serve_settings(opts, "static")["batch_size"]
    # measured only: the simulator has no noise and no start-up, its few-batch runs hold
    caution = None if opts.sim else too_few_requests(n, b, opts.schedulers)
    if caution:  # before the runs, so that a user can stop and rerun with more
        console.print(f"caution: {caution}", highlight=False, soft_wrap=True)
    if opts.sim:
        res = run_simulated(opts, spec, parent, console)
    else:
        res = run_measured(opts, spec, parent, console)
    res.caution = caution
    if res.run_dirs and opts.report:
        from cbbench.harness.report import build_report

        path = parent / "report.html"
        path.write_text(build_report([str(d) for d in res.run_dirs]).html(), encoding="utf-8")
        res.report = path
    return res


def run_measured(opts: RunOptions, spec: str, parent: Path, console: Console) -> RunDemoResult:
    """One server and one bench run per scheduler (finished requests are kept on Ctrl-C)."""
    from cbbench.harness.load.runner import BenchConfig, run_bench
    from cbbench.harness.servers.launcher import launch_reference_server
    from cbbench.harness.telemetry import TelemetryOptions, build_samplers
    from cbbench.workloads import load_workload, with_arrivals

    device = opts.engine.get("device") or default_device()
    model = opts.engine.get("model") or "tiny"
    wl = load_workload(spec, seed=opts.seed, num_requests=opts.num_requests)
    if opts.rate is not None:
        wl = with_arrivals(wl, "poisson", rate=opts.rate, seed=opts.seed)
    concurrency = opts.concurrency or (None if wl.open_loop else len(wl))
    slo = parse_slo(opts.slo)
    telemetry = TelemetryOptions(gpu_metrics=device.startswith("cuda"))
    result = RunDemoResult(parent, [], {}, False, device)
    runs = variants(opts)
    names = [v.name for v in runs]
    mean_len = mean_seq_len(wl)
    console.print(
        f"cbbench run: {len(wl)} requests of {wl.name} against the reference engine ({model} "
        f"on {device}), once per scheduler: {', '.join(names)}; results in {parent}"
    )
    try:
        for i, v in enumerate(runs):
            name, scheduler = v.name, v.scheduler
            flags = engine_argv(serve_settings(opts, scheduler, v))
            console.print(f"[bold][{i + 1}/{len(names)}] {name}[/bold]: starting cbbench serve ...")
            with launch_reference_server(model, scheduler, device, flags) as server:
                cfg = BenchConfig(
                    base_url=server.base_url,
                    workload=wl,
                    concurrency=concurrency,
                    slo=slo,
                    out_dir=parent / name,
                    name=name,
                    warmup=min(RUN_WARMUP, len(wl)),
                    command=list(opts.command),
                    live=opts.live,
                    timing_warning=False,  # judged once over the runs, below
                    load={"rate": opts.rate, "scheduler": scheduler, "engine_flags": flags},
                    extra_body={}
                    if opts.temperature is None
                    else {"temperature": opts.temperature},
                )
                console.print(f"  sending {len(wl)} requests to {server.base_url} ...")
                res = run_bench(
                    cfg, build_samplers(telemetry, server.base_url), Console(stderr=True)
                )
            result.run_dirs.append(res.run_dir)
            result.summaries[name] = s = res.summary
            s["kv_pool"] = kv_pool(_run_json(res.run_dir), mean_len)  # type: ignore[typeddict-item]
            if res.interrupted:  # the table says "89/256 (Ctrl-C)", not "89/89"
                s["interrupted_of"] = len(wl)  # type: ignore[typeddict-item]
            done = s["counts"]["total"] if not res.interrupted else len(wl)
            console.print(
                f"  {name}: {s['counts']['completed']}/{done} requests in "
                f"{s['duration_s']:.1f}s, {s['output_throughput'] or 0:.1f} output tok/s "
                f"-> {res.run_dir}"
            )
            if res.interrupted:
                console.print("[yellow]interrupted: remaining schedulers skipped[/yellow]")
                result.interrupted = True
                return result
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: remaining schedulers skipped[/yellow]")
        result.interrupted = True
    timing_note(result.run_dirs, console)
    return result


def mean_seq_len(wl) -> float | None:
    """The workload's mean request length in tokens (prompt + output): capacity's unit."""
    reqs = wl.requests
    return sum(r.prompt_len + r.output_len for r in reqs) / len(reqs) if reqs else None


def _run_json(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "run.json").read_text(encoding="utf-8"))


def run_simulated(opts: RunOptions, spec: str, parent: Path, console: Console) -> RunDemoResult:
    """The simulation study with the run's settings (once per KV dtype when several are
    given): its SIMULATED table with the KV pool rows, one run folder per run."""
    from cbbench.harness.results.compare import comparison_table, emit_table
    from cbbench.harness.studies.simulation import (
        SimOptions,
        print_timeline,
        run_summary,
        simulate,
        write_run,
    )

    base = {k: v for k, v in opts.engine.items() if k != "scheduler"}
    base.update(executor="sim", hardware=opts.sim)
    model = base.get("model", SIM_DEFAULTS["model"])
    console.print(
        f"cbbench run --sim {opts.sim}: SIMULATED on {opts.sim} ({model}), no server "
        f"started; results in {parent}"
    )
    dtypes: list[str | None] = (
        list(opts.kv_cache_dtypes) if len(opts.kv_cache_dtypes) > 1 else [None]
    )
    studies = []
    for d in dtypes:
        engine = dict(base) if d is None else {**base, "kv_cache_dtype": d}
        sim = SimOptions(
            workload=spec,
            schedulers=opts.schedulers,
            engine=engine,
            engine_defaults={**SIM_DEFAULTS, "batch_size": 8},  # a preset's own B beats it
            seed=opts.seed,
            num_requests=opts.num_requests,
            rate=opts.rate,
            command=list(opts.command),
        )
        if d is not None:
            console.print(f"[bold]--kv-cache-dtype {d}[/bold]")
        studies.append((d, simulate(sim, console)))
    # the same scheduler's runs side by side: continuous, continuous+int8, ...
    runs = [
        (dtype_label(name, d), name, res, study)
        for name in studies[0][1].results
        for d, study in studies
        for n, res in study.results.items()
        if n == name
    ]
    result = RunDemoResult(parent, [], {}, False)
    summaries: dict[str, RunSummary] = {}
    for label, _name, res, study in runs:
        run_dir = write_run(
            parent, label, res, study.workload, workload_name=spec, rate=opts.rate,
            command=opts.command,
        )  # fmt: skip
        console.print(f"  run folder: {run_dir}")
        result.run_dirs.append(run_dir)
        summ = run_summary(res, label)
        summ["sim"]["num_running_max"] = max((s.num_running for s in res.steps), default=0)
        summ["kv_pool"] = kv_pool(_run_json(run_dir), mean_seq_len(study.workload))  # type: ignore[typeddict-item]
        summaries[label] = summ
    first = studies[0][1]
    assert all(r.simulated for _, _, r, _ in runs), "--sim forces the simulated executor"
    label = "metric (SIMULATED)"
    table = comparison_table(summaries, first.title, steps=first.steps_mode, label=label)
    console.print(f"table: {emit_table(console, table, parent)}")
    if first.timeline:
        console.print("[bold yellow]SIMULATED timeline[/bold yellow] (one column per engine step)")
        for label, _name, res, _study in runs:
            print_timeline(console, label, res)
    return result
