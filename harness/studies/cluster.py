"""`cbbench sim --replicas N --router P1,P2`: the routing policies over N simulated replicas,
side by side (reference_engine/router/cluster_sim.py); every number SIMULATED except the
routing time and the wall time (measured on this machine).

`simulate_cluster_study(ClusterOptions)` -> `ClusterStudy`; `print_cluster_study` prints one
table, a column per policy (Markdown when piped; a copy under --out as cluster.md and the
summaries as cluster.json).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cbbench.harness.console.progress import request_progress
from cbbench.harness.errors import CbbenchError
from cbbench.harness.results import compare
from cbbench.harness.studies.simulation import SimOptions, load_sim_workload
from cbbench.reference_engine.config.options import build_engine_config
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.router.cluster_sim import ClusterResult, simulate_cluster
from cbbench.reference_engine.router.registry import POLICY_NAMES, make_policy
from cbbench.workloads.presets import preset_settings
from rich.console import Console
from rich.table import Table


@dataclass
class ClusterOptions:
    sim: SimOptions  # workload, engine settings, seed, --out (one scheduler)
    num_replicas: int = 2
    policies: list[str] = field(default_factory=lambda: list(POLICY_NAMES))


@dataclass
class ClusterStudy:
    options: ClusterOptions
    title: str
    results: dict[str, ClusterResult]
    summaries: dict[str, dict[str, Any]]


def policy_names(text: str | None) -> list[str]:
    if text is None:
        return list(POLICY_NAMES)
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in POLICY_NAMES]
    if bad or not names:
        raise CbbenchError(
            f"--router: unknown policy {', '.join(bad) or repr(text)} (choose from "
            f"{', '.join(POLICY_NAMES)}, comma-separated)"
        )
    return names


def simulate_cluster_study(opts: ClusterOptions, console: Console) -> ClusterStudy:
    so = opts.sim
    if len(so.schedulers) != 1:
        raise CbbenchError("--replicas: give one --scheduler (default continuous)")
    wl = load_sim_workload(so, console)
    defaults = {**so.engine_defaults, **preset_settings(so.workload)}
    cfg = build_engine_config({**so.engine, "seed": wl.seed}, defaults, scheduler=so.schedulers[0])
    results: dict[str, ClusterResult] = {}
    for name in opts.policies:
        label = f"{name}: {opts.num_replicas} replicas"
        with request_progress(console, label, len(wl)) as upd:
            try:
                results[name] = simulate_cluster(
                    wl.requests, cfg, opts.num_replicas, make_policy(name),
                    prefix_block_size=wl.prefix_block_size, seed=wl.prompt_seed, on_progress=upd,
                    event_skip=True,  # sim/event_skip.py: the stepping path's results, faster
                )  # fmt: skip
            except EngineError as exc:
                if "workload request" in str(exc):
                    raise CbbenchError(f"{exc} (--drop-too-long skips such requests)") from None
                raise
        console.print(f"{name}: {len(wl)} requests simulated in {results[name].wall_s:.1f}s wall")
    title = (
        f"SIMULATED: {opts.num_replicas} x {cfg.model} ({cfg.scheduler}, B={cfg.max_batch_slots}, "
        f"prefix caching {'on' if cfg.enable_prefix_caching else 'off'}) on {cfg.hardware}, "
        f"workload {so.workload} ({len(wl)} requests, seed {wl.seed}) — modelled step times"
    )
    summaries = {n: r.summary() for n, r in results.items()}
    return ClusterStudy(opts, title, results, summaries)


def _ms(d: dict, key: str) -> str:
    v = d.get(key) if d else None
    return "-" if v is None else f"{v * 1e3:.1f}"


def _f(v: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if v is None else fmt.format(v)


ROWS = (
    ("duration (s)", lambda s: _f(s["duration_s"], "{:.1f}")),
    ("output tok/s", lambda s: _f(s["output_throughput"], "{:.0f}")),
    ("TTFT p50 / p99 (ms)", lambda s: f"{_ms(s['ttft_s'], 'p50')} / {_ms(s['ttft_s'], 'p99')}"),
    (
        "TTFT later turns p50 / p99 (ms)",
        lambda s: f"{_ms(s['ttft_later_turns_s'], 'p50')} / {_ms(s['ttft_later_turns_s'], 'p99')}",
    ),
    ("TPOT p50 (ms)", lambda s: _ms(s["tpot_s"], "p50")),
    ("E2E p99 (s)", lambda s: _f(s["e2e_s"]["p99"], "{:.2f}")),
    ("prefix-cache hit rate", lambda s: _f(s["prefix_cache_hit_rate"])),
    ("hit rate, later turns", lambda s: _f(s["prefix_cache_hit_rate_later_turns"])),
    ("preemptions", lambda s: str(s["num_preemptions"])),
    ("requests/replica max/mean", lambda s: _f(s["requests_per_replica"]["max_over_mean"])),
    ("requests/replica CV", lambda s: _f(s["requests_per_replica"]["cv"])),
    ("outstanding/replica max/mean", lambda s: _f(s["outstanding_per_replica"]["max_over_mean"])),
    ("outstanding/replica CV", lambda s: _f(s["outstanding_per_replica"]["cv"])),
    (
        "routing p50 / p99 (us, measured)",
        lambda s: (
            f"{_f(s['routing_time_s']['p50'] * 1e6, '{:.1f}')} / "
            f"{_f(s['routing_time_s']['p99'] * 1e6, '{:.1f}')}"
        ),
    ),
    ("wall (s, measured)", lambda s: _f(s["wall_s"], "{:.1f}")),
)


def cluster_table(study: ClusterStudy) -> Table:
    table = Table(title=study.title)
    table.add_column("metric (SIMULATED)")
    for name in study.summaries:
        table.add_column(name, justify="right")
    for label, cell in ROWS:
        table.add_row(label, *(cell(s) for s in study.summaries.values()))
    return table


def print_cluster_study(study: ClusterStudy, console: Console) -> None:
    out: Path | None = study.options.sim.out
    path = compare.emit_table(console, cluster_table(study), out, name="cluster.md")
    if out is not None:
        doc = {"title": study.title, "command": study.options.sim.command, **study.summaries}
        (out / "cluster.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")
        console.print(f"table: {path}; summaries: {out / 'cluster.json'}")
