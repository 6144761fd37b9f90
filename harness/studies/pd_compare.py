"""`cbbench sim --prefill-replicas P --decode-replicas D`: the same workload on P + D
aggregated replicas and on P prefill + D decode workers (reference_engine/router/pd_sim.py),
side by side: TTFT, TPOT, ITL, E2E, throughput and the disaggregated run's phases. Every
number SIMULATED (docs/disaggregation.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cbbench.harness.console.progress import request_progress
from cbbench.harness.errors import CbbenchError
from cbbench.harness.results import compare
from cbbench.harness.studies.simulation import SimOptions, load_sim_workload
from cbbench.reference_engine.config.options import build_engine_config
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution import kv_import
from cbbench.reference_engine.execution.cost_model import get_hardware
from cbbench.reference_engine.execution.kv_link import get_link
from cbbench.reference_engine.router.pd_sim import simulate_pd
from cbbench.reference_engine.sim import request_overhead as ro
from cbbench.reference_engine.sim.pd_link import resolve_link
from cbbench.workloads.presets import preset_settings
from rich.console import Console
from rich.table import Table

PHASES = ("prefill_queue_s", "prefill_s", "kv_transfer_s", "decode_queue_s", "decode_s")


@dataclass
class PDCompareOptions:
    sim: SimOptions  # workload, engine settings, seed, --out
    num_prefill: int
    num_decode: int
    link: str | None = None  # None: the hardware fit's measured hand-off, else same-node


def pd_compare(opts: PDCompareOptions, console: Console) -> dict[str, dict[str, Any]]:
    """{"aggregated": summary, "disaggregated": summary} (pd_sim's summaries)."""
    if opts.num_prefill < 1 or opts.num_decode < 1:
        raise CbbenchError("--prefill-replicas and --decode-replicas must both be >= 1")
    so = opts.sim
    wl = load_sim_workload(so, console)
    defaults = {**so.engine_defaults, **preset_settings(so.workload)}
    try:
        cfg = build_engine_config({**so.engine, "seed": wl.seed}, defaults, scheduler="continuous")
        hw = get_hardware(cfg.hardware)
        pd_link = resolve_link(opts.link, hw)
        link = get_link(pd_link.spec)
    except EngineError as exc:
        raise CbbenchError(str(exc)) from None
    opts.link = pd_link.spec
    out = {}
    total = opts.num_prefill + opts.num_decode
    # a from-run fit's time outside the steps, paid per request as `sim` and `plan` pay it
    over = ro.overhead_of(hw)
    if line := ro.describe(over):
        console.print(line)
    console.print(pd_link.line(over), highlight=False)
    console.print(kv_import.describe(hw), highlight=False)
    hop = pd_link.decode_overhead(over)
    for mode, p, d in (
        ("aggregated", 0, total),
        ("disaggregated", opts.num_prefill, opts.num_decode),
    ):
        with request_progress(console, mode, len(wl)):
            try:
                res = ro.with_overhead(wl.requests, over, lambda reqs, p=p, d=d: simulate_pd(
                    reqs, cfg, p, d, link, token_times=True,
                    prefix_block_size=wl.prefix_block_size, seed=wl.prompt_seed,
                    decode_overhead=hop),
                    d if p == 0 else 1)  # fmt: skip
            except EngineError as exc:
                raise CbbenchError(str(exc)) from None
        out[mode] = res.summary()
        if p:
            out[mode]["link_source"] = pd_link.source
    return out


def print_pd_compare(opts: PDCompareOptions, summaries: dict[str, dict], console: Console) -> None:
    p, d = opts.num_prefill, opts.num_decode
    cols = {f"aggregated ({p + d} replicas)": summaries["aggregated"],
            f"disaggregated ({p}P:{d}D, {opts.link})": summaries["disaggregated"]}  # fmt: skip

    def ms(s: dict, key: str, stat: str) -> str:
        v = (s.get(key) or {}).get(stat)
        return "-" if v is None else f"{v * 1e3:.1f}"

    rows: list[tuple[str, list[str]]] = []
    for key, name in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E")):
        for stat in ("p50", "p99"):
            rows.append((f"{name} {stat} (ms)", [ms(s, key, stat) for s in cols.values()]))
    rows.append(("output tok/s", [f"{s['output_throughput'] or 0:.1f}" for s in cols.values()]))
    dis = summaries["disaggregated"]
    for key in PHASES:
        rows.append((f"{key.removesuffix('_s').replace('_', ' ')} p50 (ms)",
                     ["-", ms(dis.get("phases", {}), key, "p50")]))  # fmt: skip
    rows.append(("KV bytes / request", ["-", f"{dis.get('kv_transfer_bytes_mean', 0):,.0f}"]))
    title = (f"SIMULATED: aggregated vs prefill/decode disaggregated, {opts.sim.workload} "
             "(modelled step times)")  # fmt: skip
    table = Table(title=title)
    for c in ("metric", *cols):
        table.add_column(c, justify="left" if c == "metric" else "right")
    for name, values in rows:
        table.add_row(name, *values)
    compare.emit_table(console, table, opts.sim.out, "pd_compare.md")
    if opts.sim.out is not None:
        (opts.sim.out / "pd_compare.json").write_text(json.dumps(summaries, indent=2))
