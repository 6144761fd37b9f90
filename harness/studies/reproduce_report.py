"""The pieces of `cbbench reproduce` (harness/cli/reproduce.py runs them in order): the seed
demo's timeline, the gains and utilization tables, the sensitivity sweep, the CPU-scale
setting, the verdicts and the brief rows of reproduce.json. The measurement itself (settings,
sustained throughput, intervals) is `harness/studies/reproduce.py`."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

from cbbench.harness.console.progress import request_progress
from cbbench.harness.studies import reproduce as rp
from rich.console import Console
from rich.table import Table

HOLDS_WITHIN = 0.15  # a gain "holds" when ours is within 15 % of the seed's


def engine_config(model: str, scheduler: str, b: int, executor: str, hardware: str, **kw):
    from cbbench.reference_engine.config.options import SIM_DEFAULTS, build_engine_config

    # dtype auto: the model's own (bf16 for the llama presets; fp32 for tiny)
    settings = {"model": model, "batch_size": b, "executor": executor, "hardware": hardware}
    return build_engine_config({**settings, **kw}, SIM_DEFAULTS, scheduler=scheduler)


def seed_demo(console: Console) -> dict[str, int]:
    """The seeds' timeline in engine steps (hardware `steps`: one time unit per step)."""
    from cbbench.harness.studies.simulation import print_timeline
    from cbbench.reference_engine.sim.simulate import replay
    from cbbench.workloads import load_workload

    wl = load_workload("seed-demo")
    console.rule("[bold]1. seed demo: outputs [10, 5, 8, 3, 12, 6], B = 4 (SIMULATED steps)")
    steps = {}
    for name in ("static", "continuous"):
        res = replay(wl.requests, engine_config("tiny", name, 4, "sim", "steps"), timeline=True)
        print_timeline(console, name, res)
        steps[name] = len(res.steps)
    console.print(
        f"static {steps['static']} steps (seeds: 22), continuous {steps['continuous']} steps "
        f"(seeds: fewer, no slot idle while requests wait)"
    )
    return steps


def scaled_workload(name: str, n: int, scale: int):
    """A preset with every prompt and output length divided by `scale` (at least 1)."""
    from cbbench.workloads import load_workload
    from cbbench.workloads.spec import Workload

    wl = load_workload(name, num_requests=n)
    if scale == 1:
        return wl
    reqs = tuple(rp.scaled(wl.requests, scale))
    return Workload(f"{name}/{scale}", wl.seed, reqs, wl.prefix_block_size, wl.source)


def run_rows(console: Console, label: str, s: rp.Setting, out: Path | None, folder: str,
          wrap=None) -> dict:  # fmt: skip
    from cbbench.harness.studies.simulation import write_run

    rows = {}
    for w in rp.WORKLOADS:
        t0 = time.perf_counter()
        desc = f"{label}: {w}, static then continuous"
        with request_progress(console, desc, 2 * (s.num_requests or 1)) as progress:
            row = rp.run_pair(w, s, wrap_executor=wrap, on_progress=progress)
        st_res, co_res = row.pop("results")
        c = row["conditions"]
        console.print(
            f"  {label} {w:<12} static B={c['static_batch_size']:<4} "
            f"{row['static']['request_throughput']:9.2f} req/s  continuous "
            f"{row['continuous']['request_throughput']:9.2f} req/s  gain {row['gain_req_s']:.2f}x"
            f"  ({time.perf_counter() - t0:.0f}s wall)",
            highlight=False,
        )
        if out is not None:
            wl = scaled_workload(w, s.num_requests, s.length_scale)
            for res in (st_res, co_res):
                write_run(out / folder / wl.name.replace("/", "_"), res.config.scheduler, res,
                          wl, workload_name=wl.name, command=sys.argv)  # fmt: skip
        rows[w] = row
    return rows


def pm(v: float, hw: float, spec: str) -> str:
    if hw != hw:  # nan
        return format(v, spec)
    return f"{format(v, spec)} ± {format(hw, spec)}"


def verdict(w: str, gain: float) -> str:
    seed = rp.SEED_ROWS[w]["gain"]
    if abs(gain / seed - 1) <= HOLDS_WITHIN:
        return "holds"
    return f"does not hold ({gain / seed:.0%} of the seed's)"


def gains_table(title: str, rows: dict, measured: bool = False) -> Table:
    t = Table(title=title)
    for col in ("workload", "seed req/s", "seed gain", "static req/s", "continuous req/s",
                "gain (req/s)", "gain (tok/s)", "makespan gain", "static B", "verdict"):  # fmt: skip
        t.add_column(col, justify="right" if col != "workload" else "left")
    for w, r in rows.items():
        sd = rp.SEED_ROWS[w]
        st, co = r["static"], r["continuous"]
        c = r["conditions"]
        t.add_row(
            w,
            f"{sd['static_rps']:g} -> {sd['continuous_rps']:g}",
            f"{sd['gain']:.2f}x",
            pm(st["request_throughput"], st["request_throughput_ci95"], ".2f"),
            pm(co["request_throughput"], co["request_throughput_ci95"], ".2f"),
            pm(r["gain_req_s"], r["gain_req_s_ci95"], ".2f") + "x",
            f"{r['gain_tok_s']:.2f}x",
            f"{r['gain_makespan']:.2f}x",
            f"{c['static_batch_size']} ({c['static_batch_limited_by']})",
            verdict(w, r["gain_req_s"]),
        )
    return t


def utilization_table(rows: dict) -> Table:
    t = Table(title="device utilization in the steady window (SIMULATED)")
    for col in ("workload", "static busy", "static slot util.", "continuous busy",
                "continuous slot util.", "seed: static / continuous"):  # fmt: skip
        t.add_column(col, justify="right" if col != "workload" else "left")
    su, cu = rp.SEED_UTILIZATION["static"], rp.SEED_UTILIZATION["continuous"]
    for w, r in rows.items():
        st, co = r["static"], r["continuous"]
        t.add_row(
            w, f"{st['busy_fraction']:.0%}", f"{st['slot_utilization']:.0%}",
            f"{co['busy_fraction']:.0%}", f"{co['slot_utilization']:.0%}",
            f"{su[0]:.0%}-{su[1]:.0%} / {cu[0]:.0%}-{cu[1]:.0%}",
        )  # fmt: skip
    t.caption = (
        "busy = share of time a step runs (what NVML reports); slot util. = live sequences "
        "computed per step / the batch the policy holds (static: B; continuous: its peak "
        "concurrency), time-weighted"
    )
    return t


def sensitivity(console: Console, base: rp.Setting) -> list[dict]:
    t = Table(title="sensitivity: gain in sustained req/s, one condition changed (SIMULATED)")
    t.add_column("condition")
    for w in rp.WORKLOADS:
        t.add_column(f"{w} (seed {rp.SEED_ROWS[w]['gain']:.2f}x)", justify="right")
    t.add_column("static B (uniform / mixed / heavy)", justify="right")
    t.add_column("makespan gain, heavy", justify="right")
    out = []
    for label, s in rp.sensitivity_settings(base):
        cells, bs, entry = [], [], {"condition": label, "setting": asdict(s), "gains": {}}
        for w in rp.WORKLOADS:
            with console.status(f"sensitivity: {label}: {w}"):
                row = rp.run_pair(w, s)
            row.pop("results")
            cells.append(pm(row["gain_req_s"], row["gain_req_s_ci95"], ".2f") + "x")
            bs.append(str(row["conditions"]["static_batch_size"]))
            entry["gains"][w] = {k: row[k] for k in ("gain_req_s", "gain_req_s_ci95",
                                 "gain_tok_s", "gain_makespan", "conditions")}  # fmt: skip
        t.add_row(
            label, *cells, " / ".join(bs), f"{entry['gains']['heavy-mixed']['gain_makespan']:.2f}x"
        )
        console.print(f"  {label}: " + ", ".join(cells), highlight=False)
        out.append(entry)
    console.print(t)
    return out


def cpu_setting(args: argparse.Namespace, sim: rp.Setting) -> rp.Setting:
    """The simulated setting at CPU scale: B and lengths shrunk, the KV pool shrunk alike
    (pool tokens x cpu_B / B / scale), so memory binds static's batch the same way. The real
    engine's static skips finished rows (it cannot pad): the best case for static."""
    pool = rp.pool_blocks(sim) * sim.block_size
    tokens = pool * args.cpu_batch_size / sim.max_num_seqs / args.cpu_scale * sim.length_scale
    return rp.Setting(
        model=args.cpu_model,
        hardware="h100",
        executor="real",
        num_requests=args.cpu_requests,
        max_num_seqs=args.cpu_batch_size,
        max_num_batched_tokens=max(8192 // args.cpu_scale, args.cpu_batch_size),
        num_kv_blocks=max(1, int(tokens // sim.block_size)),
        length_scale=args.cpu_scale,
        dtype="float32",
        static_padded=False,  # the real engine's static skips finished rows
    )


def brief(row: dict) -> dict:
    st, co = row["static"], row["continuous"]
    return {
        "static_req_s": st["request_throughput"],
        "continuous_req_s": co["request_throughput"],
        "gain": row["gain_req_s"],
        "gain_ci95": row["gain_req_s_ci95"],
        "gain_tok_s": row["gain_tok_s"],
        "gain_makespan": row["gain_makespan"],
        "utilization": {
            "static": {k: st[k] for k in ("busy_fraction", "slot_utilization")},
            "continuous": {k: co[k] for k in ("busy_fraction", "slot_utilization")},
        },
        "conditions": {**row["conditions"], **{k: row["setting"][k] for k in (
            "model", "hardware", "executor", "num_requests", "length_scale")}},
    }  # fmt: skip


def verdicts(sim: dict, cpu: dict | None) -> list[str]:
    lines = []
    for label, rows in (("simulated", sim), ("measured on CPU", cpu)):
        if rows is None:
            continue
        g = {w: rows[w]["gain_req_s"] for w in rp.WORKLOADS}
        parts = [f"{w} {g[w]:.2f}x (seed {rp.SEED_ROWS[w]['gain']:.2f}x: {verdict(w, g[w])})"
                 for w in rp.WORKLOADS]  # fmt: skip
        order = g["uniform"] < g["mixed"] < g["heavy-mixed"]
        lines.append(
            f"{label}: " + "; ".join(parts) + f". Ordering uniform < mixed < highly mixed "
            f"{'holds' if order else 'does NOT hold'}; uniform "
            f"{'is' if abs(g['uniform'] - 1) <= 0.05 else 'is NOT'} within 5% of 1.0."
        )
    return lines
