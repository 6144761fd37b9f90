"""`cbbench run`, as a library call: the same workload once per scheduler, measured (a real
`cbbench serve` per scheduler, load over HTTP, telemetry on) or simulated (the in-process
replay of `harness.studies.simulation` on a modelled device).

Same model, same KV pool, same B (static batch size = dynamic max batch size = continuous
max_num_seqs), same requests: only the batching policy changes.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cbbench.harness.errors import CbbenchError
from cbbench.harness.results.summary import RunSummary, parse_slo
from cbbench.reference_engine.config.engine_config import SCHEDULERS
from cbbench.reference_engine.config.options import FLAGS, SIM_DEFAULTS, engine_argv
from cbbench.workloads.presets import preset_settings
from rich.console import Console

DEFAULT_SLO = "ttft=10s,tpot=100ms"
# The default workload: mixed output lengths (the case continuous batching is for), sized so
# that all three schedulers finish in about two minutes on 2 CPU cores with the tiny model.
RUN_WORKLOAD: dict = {
    "name": "run-demo",
    "description": "mixed lengths for `cbbench run`: 256 requests, outputs lognormal (median "
    "128, sigma 0.9, 8-1024), prompts lognormal (median 64, 8-512), all at once",
    "num_requests": 256,
    "prompt": {"dist": "lognormal", "median": 64, "sigma": 0.6, "min": 8, "max": 512},
    "output": {"dist": "lognormal", "median": 128, "sigma": 0.9, "min": 8, "max": 1024},
}


@dataclass
class RunOptions:
    """One `cbbench run`."""

    schedulers: list[str] = field(default_factory=lambda: list(SCHEDULERS))
    engine: dict[str, Any] = field(default_factory=dict)  # engine settings given (flag dests)
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
        parse_slo(self.slo)


@dataclass
class RunDemoResult:
    parent: Path
    run_dirs: list[Path]
    summaries: dict[str, RunSummary]  # measured runs: scheduler -> run summary
    interrupted: bool
    device: str = "sim"
    report: Path | None = None


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


def variants(opts: RunOptions) -> list[tuple[str, str]]:
    """(run name, scheduler) per server to start: one per scheduler; with a speculative
    method given, "continuous+spec" runs right after plain "continuous" (speculation applies
    to the continuous scheduler only): with and without it on the same workload."""
    spec = opts.engine.get("speculative_method") is not None
    out = []
    for name in opts.schedulers:
        out.append((name, name))
        if spec and name == "continuous":
            out.append((SPEC_NAME, name))
    return out


def serve_settings(opts: RunOptions, scheduler: str, run_name: str | None = None) -> dict[str, Any]:
    """The engine settings one server gets: every setting given, plus the seed; the
    speculative ones only for the speculative variant."""
    skip = {"model", "device", "scheduler"}
    if run_name != SPEC_NAME:
        skip |= set(SPEC_DESTS)
    out = {k: v for k, v in opts.engine.items() if k not in skip}
    # B, also the dynamic/continuous size unless given: the preset's own (seed-demo: 4), else 8
    out.setdefault("batch_size", preset_settings(opts.workload or "").get("batch_size", 8))
    if scheduler != "static":
        out.pop("drain_timeout", None)
    out["seed"] = opts.seed
    return out


def run_demo(opts: RunOptions, console: Console | None = None) -> RunDemoResult:
    """Every scheduler in turn; then the HTML report over their run folders."""
    console = console or Console()
    opts.check()
    if opts.workload:  # a bad spec fails before any folder is made
        from cbbench.workloads import load_workload

        load_workload(opts.workload, seed=opts.seed, num_requests=opts.num_requests)
    parent = parent_dir(opts.out)
    spec = workload_spec(opts, parent)
    if opts.sim:
        res = run_simulated(opts, spec, parent, console)
    else:
        res = run_measured(opts, spec, parent, console)
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
    names = [n for n, _ in runs]
    console.print(
        f"cbbench run: {len(wl)} requests of {wl.name} against the reference engine ({model} "
        f"on {device}), once per scheduler: {', '.join(names)}; results in {parent}"
    )
    try:
        for i, (name, scheduler) in enumerate(runs):
            flags = engine_argv(serve_settings(opts, scheduler, name))
            console.print(f"[bold][{i + 1}/{len(names)}] {name}[/bold]: starting cbbench serve ...")
            with launch_reference_server(model, scheduler, device, flags) as server:
                cfg = BenchConfig(
                    base_url=server.base_url,
                    workload=wl,
                    concurrency=concurrency,
                    slo=slo,
                    out_dir=parent / name,
                    name=name,
                    command=list(opts.command),
                    live=opts.live,
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
            console.print(
                f"  {name}: {s['counts']['completed']}/{s['counts']['total']} requests in "
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
    return result


def run_simulated(opts: RunOptions, spec: str, parent: Path, console: Console) -> RunDemoResult:
    """The simulation study with the run's settings: its SIMULATED table, one run folder per
    scheduler."""
    from cbbench.harness.studies.simulation import SimOptions, print_study, simulate

    engine = {k: v for k, v in opts.engine.items() if k != "scheduler"}
    engine.update(executor="sim", hardware=opts.sim)
    sim = SimOptions(
        workload=spec,
        schedulers=opts.schedulers,
        engine=engine,
        engine_defaults={**SIM_DEFAULTS, "batch_size": 8},  # a preset's own B beats it
        seed=opts.seed,
        num_requests=opts.num_requests,
        rate=opts.rate,
        out=parent,
        command=list(opts.command),
    )
    model = engine.get("model", SIM_DEFAULTS["model"])
    console.print(
        f"cbbench run --sim {opts.sim}: SIMULATED on {opts.sim} ({model}), no server "
        f"started; results in {parent}"
    )
    study = simulate(sim, console)
    print_study(study, console)
    return RunDemoResult(parent, study.run_dirs, {}, False)
