"""The pieces of `cbbench reproduce` (harness/cli/reproduce.py runs them in order): the seed
demo's timeline, the gains and utilization tables, the sensitivity sweep, the CPU-scale
setting, the verdicts and the brief rows of reproduce.json. The measurement itself (settings,
sustained throughput, replicates) is `harness/studies/reproduce.py`; the intervals and the
verdict rules are `harness/studies/reproduce_stats.py`."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from cbbench.harness.console.progress import request_progress
from cbbench.harness.studies import reproduce as rp
from cbbench.harness.studies import reproduce_jobs as rj
from cbbench.harness.studies import reproduce_stats as rs
from rich.console import Console
from rich.table import Table

HOLDS_WITHIN = 0.15  # a gain "holds" when its interval lies within 15 % of the seed's
UNIFORM_WITHIN = 0.05  # "uniform gains nothing": its interval lies within 5 % of 1.0


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


def scaled_workload(name: str, n: int, scale: int, seed: int | None = None):
    """A preset with every prompt and output length divided by `scale` (at least 1)."""
    from cbbench.workloads import load_workload
    from cbbench.workloads.spec import Workload

    wl = load_workload(name, seed=seed, num_requests=n)
    if scale == 1:
        return wl
    reqs = tuple(rp.scaled(wl.requests, scale))
    return Workload(f"{name}/{scale}", wl.seed, reqs, wl.prefix_block_size, wl.source)


def iv(d: dict) -> rs.Interval:
    """An interval back from its JSON form."""
    return rs.Interval(d["mean"], d["half_width"], d["n"], tuple(d.get("values", ())))


def run_rows(console: Console, label: str, s: rp.Setting, out: Path | None, folder: str,
          wrap=None, jobs: int = 1) -> dict:  # fmt: skip
    """The three workloads, `s.replicates` replicates each; run folders (one per replicate
    and scheduler) under out/folder/<workload>/seed<k>/ when `out` is given."""
    from cbbench.harness.studies.simulation import write_run

    def write(row: dict, results: tuple) -> None:
        wl = scaled_workload(row["workload"], s.num_requests, s.length_scale, row["seed"])
        where = out / folder / wl.name.replace("/", "_") / f"seed{row['seed']}"
        for res in results:
            write_run(where, res.config.scheduler, res, wl, workload_name=wl.name,
                      command=sys.argv)  # fmt: skip

    rows = {}
    for w in rp.WORKLOADS:
        t0 = time.perf_counter()
        desc = f"{label}: {w}, {s.replicates} replicates, static then continuous"
        with request_progress(console, desc, 2 * s.num_requests * s.replicates) as progress:
            row = rj.run_replicates(w, s, wrap_executor=wrap, on_progress=progress, jobs=jobs,
                                    on_result=write if out is not None else None)  # fmt: skip
        c = row["conditions"]
        console.print(
            f"  {label} {w:<12} static B={c['static_batch_size']:<4} "
            f"{iv(row['static_req_s']).text(unit=' req/s')}  continuous "
            f"{iv(row['continuous_req_s']).text(unit=' req/s')}  gain "
            f"{iv(row['gain_req_s']).text(unit='x')}"
            f"  ({s.replicates} replicates, {time.perf_counter() - t0:.0f}s wall)",
            soft_wrap=True,
            highlight=False,
        )
        rows[w] = row
    return rows


def seed_verdict(w: str, gain: rs.Interval) -> str:
    return rs.ratio_verdict(gain, rp.SEED_ROWS[w]["gain"], HOLDS_WITHIN)


def claims(rows: dict) -> dict[str, str]:
    """The seed's claims for one set of rows (simulated or measured), each with its verdict."""
    g = {w: iv(rows[w]["gain_req_s"]) for w in rp.WORKLOADS}
    out = {
        f"{w} gain within {HOLDS_WITHIN:.0%} of the seed's {rp.SEED_ROWS[w]['gain']:.2f}x":
        seed_verdict(w, g[w]) for w in rp.WORKLOADS
    }  # fmt: skip
    out["ordering uniform < mixed < highly mixed"] = rs.order_verdict([g[w] for w in rp.WORKLOADS])
    out[f"uniform within {UNIFORM_WITHIN:.0%} of 1.0"] = rs.band_verdict(
        g["uniform"], 1 - UNIFORM_WITHIN, 1 + UNIFORM_WITHIN
    )
    return out


def method_line(rows: dict) -> str:
    r = next(iter(rows.values()))
    seeds = r["seeds"]
    reused = [w for w, row in rows.items()
              if any("same_requests_as_seed" in x for x in row["replicates"])]  # fmt: skip
    return (
        f"± = {rs.METHOD}: {len(seeds)} replicates per workload (seeds {seeds[0]}-{seeds[-1]}), "
        f"each {r['setting']['num_requests']} requests, static and continuous on the same "
        "requests" + "".join(f"; {w}: one request set whatever the seed (constant lengths), "
                             "simulated once" for w in reused)
    )  # fmt: skip


def gains_table(title: str, rows: dict) -> Table:
    t = Table(title=title)
    for col in ("workload", "seed req/s", "seed gain", "static req/s", "continuous req/s",
                "gain (req/s)", "95 % interval", "makespan gain", "static B", "verdict"):  # fmt: skip
        t.add_column(col, justify="right" if col != "workload" else "left")
    for w, r in rows.items():
        sd = rp.SEED_ROWS[w]
        c = r["conditions"]
        g = iv(r["gain_req_s"])
        t.add_row(
            w,
            f"{sd['static_rps']:g} -> {sd['continuous_rps']:g}",
            f"{sd['gain']:.2f}x",
            iv(r["static_req_s"]).text(),
            iv(r["continuous_req_s"]).text(),
            g.text(unit="x"),
            f"[{g.lo:.2f}, {g.hi:.2f}]" if g.resolved else "-",
            f"{r['gain_makespan']['mean']:.2f}x",
            f"{c['static_batch_size']} ({c['static_batch_limited_by']})",
            seed_verdict(w, g),
        )
    t.caption = (
        f"{method_line(rows)}. Verdict: holds when the interval lies within {HOLDS_WITHIN:.0%} "
        "of the seed's gain, does not hold when it lies outside, else not resolved"
    )
    return t


def utilization_table(rows: dict) -> Table:
    t = Table(title="device utilization in the steady window, mean over replicates (SIMULATED)")
    for col in ("workload", "static busy", "static slot util.", "continuous busy",
                "continuous slot util.", "seed: static / continuous"):  # fmt: skip
        t.add_column(col, justify="right" if col != "workload" else "left")
    su, cu = rp.SEED_UTILIZATION["static"], rp.SEED_UTILIZATION["continuous"]
    for w, r in rows.items():
        st, co = r["utilization"]["static"], r["utilization"]["continuous"]
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


def sensitivity_settings(base: rp.Setting) -> list[tuple[str, rp.Setting]]:
    """One factor at a time around `base`: B, max_model_len, KV memory, request count."""
    out = [("base", base)]
    for b in (32, 64):
        out.append((f"B (max_num_seqs, static cap) = {b}", replace(base, max_num_seqs=b)))
    out.append(("max_model_len = 8192 (model maximum)", replace(base, max_model_len=8192)))
    out.append(("static skips finished rows (not padded)", replace(base, static_padded=False)))
    out.append(("KV memory = 16 GiB", replace(base, kv_cache_memory_gb=16.0)))
    out.append(("KV memory = 400 GiB (static B = 256)", replace(base, kv_cache_memory_gb=400.0)))
    for n in (200, 2 * base.num_requests):
        out.append((f"requests = {n}", replace(base, num_requests=n)))
    return out


def sensitivity(console: Console, base: rp.Setting, jobs: int = 1) -> list[dict]:
    t = Table(title="sensitivity: gain in sustained req/s, one condition changed (SIMULATED)")
    t.add_column("condition")
    for w in rp.WORKLOADS:
        t.add_column(f"{w} (seed {rp.SEED_ROWS[w]['gain']:.2f}x)", justify="right")
    t.add_column("static B (uniform / mixed / heavy)", justify="right")
    t.add_column("makespan gain, heavy", justify="right")
    out = []
    for label, s in sensitivity_settings(base):
        cells, bs, entry = [], [], {"condition": label, "setting": asdict(s), "gains": {}}
        for w in rp.WORKLOADS:
            with console.status(f"sensitivity: {label}: {w}"):
                row = rj.run_replicates(w, s, jobs=jobs)
            cells.append(iv(row["gain_req_s"]).text(unit="x"))
            bs.append(str(row["conditions"]["static_batch_size"]))
            entry["gains"][w] = {k: row[k] for k in ("gain_req_s", "gain_makespan",
                                 "conditions", "seeds")}  # fmt: skip
        t.add_row(
            label, *cells, " / ".join(bs),
            f"{entry['gains']['heavy-mixed']['gain_makespan']['mean']:.2f}x",
        )  # fmt: skip
        console.print(f"  {label}: " + ", ".join(cells), highlight=False, soft_wrap=True)
        out.append(entry)
    t.caption = f"± = {rs.METHOD}, {base.replicates} replicates per cell"
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
        replicates=args.cpu_replicates,
        seed=sim.seed,
    )


def brief(row: dict) -> dict:
    g = iv(row["gain_req_s"])
    return {
        "static_req_s": row["static_req_s"]["mean"],
        "continuous_req_s": row["continuous_req_s"]["mean"],
        "gain": g.mean,
        "gain_ci95": g.half_width,
        "gain_interval": [g.lo, g.hi],
        "interval_method": f"{rs.METHOD}, n = {g.n}",
        "replicate_gains": list(g.values),
        "seeds": row["seeds"],
        "verdict_vs_seed": seed_verdict(row["workload"], g),
        "gain_tok_s": row["gain_tok_s"]["mean"],
        "gain_makespan": row["gain_makespan"]["mean"],
        "utilization": row["utilization"],
        "conditions": {**row["conditions"], **{k: row["setting"][k] for k in (
            "model", "hardware", "executor", "num_requests", "length_scale", "replicates")}},
    }  # fmt: skip


def verdicts(sim: dict, cpu: dict | None) -> list[str]:
    """One line per set of rows: each gain with its interval and every claim's verdict."""
    lines = []
    for label, rows in (("simulated", sim), ("measured on CPU", cpu)):
        if rows is None:
            continue
        gains = "; ".join(
            f"{w} {iv(rows[w]['gain_req_s']).text(unit='x')}" for w in rp.WORKLOADS
        )  # fmt: skip
        n = iv(rows["uniform"]["gain_req_s"]).n
        said = "; ".join(f"{claim}: {v}" for claim, v in claims(rows).items())
        lines.append(f"{label} ({n} replicates, 95 % t-intervals): {gains}. {said}.")
    return lines
