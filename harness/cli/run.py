"""`cbbench run`: the one-command demo. Once per scheduler (static, dynamic, continuous), start
the reference engine's server, replay one workload against it over HTTP with the load
generator and telemetry on, then print the runs side by side and write an HTML report.

Same model, same KV pool, same batch size B (static batch size = dynamic max batch size =
continuous max_num_seqs), same requests: only the batching policy changes. `--sim HARDWARE`
runs the same comparison in the simulator instead (in-process, virtual time, SIMULATED).

Speculative decoding: give `--speculative-method` (and its flags) and a "continuous+spec"
server runs right after plain "continuous" on the same workload, side by side, e.g.
`cbbench run --schedulers continuous --speculative-method draft --speculative-model tiny`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cbbench.reference_engine.options import add_engine_args, engine_settings, scheduler_names
from rich.table import Table

DEFAULT_SLO = "ttft=10s,tpot=100ms"
DEFAULT_SIM_MODEL = "llama-3-8b"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="the demo: static vs dynamic vs continuous batching on the reference engine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--workload",
        default=None,
        help="preset, trace or spec file (default: run-demo, 256 mixed-length requests)",
    )
    p.add_argument("--num-requests", type=int, default=None, help="first N requests")
    p.add_argument(
        "--schedulers", dest="scheduler", default=None, help="same as --scheduler (comma list)"
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="closed loop with this many requests in flight (default: all at once)",
    )
    p.add_argument(
        "--rate", type=float, default=None, help="open loop: Poisson arrivals at R req/s"
    )
    p.add_argument("--slo", default=DEFAULT_SLO, help=f"goodput SLOs (default {DEFAULT_SLO})")
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sampling temperature sent with every request (0 = greedy; default: the server's)",
    )
    p.add_argument(
        "--sim",
        metavar="HARDWARE",
        default=None,
        help="simulate instead (h100, a100-80g, h200, cpu-measured, steps or a calibrate JSON); "
        f"the model then defaults to {DEFAULT_SIM_MODEL}",
    )
    p.add_argument("--out", default=None, help="parent folder (default results/runs/<time>-run)")
    p.add_argument("--no-report", action="store_true", help="skip the HTML report")
    p.add_argument("--no-live", action="store_true", help="no live view during each run")
    add_engine_args(p, help_defaults={"device": "cuda if present, else cpu"})
    p.set_defaults(func=run)


def run_options(args: argparse.Namespace):
    """The typed options of the parsed flags."""
    from cbbench.harness.studies.run_demo import RunOptions

    engine = engine_settings(args)
    names = scheduler_names(engine.pop("scheduler", None))
    seed = engine.pop("seed", 0)
    sim = args.sim
    if engine.get("executor") == "sim" and not sim:
        sim = engine.get("hardware") or "h100"
    return RunOptions(
        schedulers=names,
        engine=engine,
        workload=args.workload,
        num_requests=args.num_requests,
        seed=seed,
        concurrency=args.concurrency,
        rate=args.rate,
        slo=args.slo,
        temperature=args.temperature,
        sim=sim,
        out=Path(args.out) if args.out else None,
        report=not args.no_report,
        live=not args.no_live,
        command=list(sys.argv),
    )


def run(args: argparse.Namespace) -> int:
    from cbbench.harness.studies.run_demo import run_demo
    from rich.console import Console

    opts = run_options(args)
    console = Console()
    res = run_demo(opts, console)
    if res.summaries:
        console.print(comparison_table(res.summaries, _title(opts, res.device)))
    if res.report is not None:
        console.print(f"report: {res.report}")
    console.print(f"run folders: {res.parent}/{{{','.join(d.name for d in res.run_dirs)}}}")
    return 130 if res.interrupted else 0


def _title(opts, device: str) -> str:
    from cbbench.harness.studies.run_demo import RUN_WORKLOAD

    wl = opts.workload or RUN_WORKLOAD["name"]
    model = opts.engine.get("model", "tiny")
    b = opts.engine.get("batch_size", 8)
    return (
        f"MEASURED over HTTP: {model} on {device}, workload {wl}, "
        f"B={b} (same KV pool for every scheduler)"
    )


def _f(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:,.0f}" if v >= 0.01 else f"{v * 1e3:.1f}"


def comparison_table(summaries: dict[str, dict], title: str) -> Table:
    """One column per scheduler: throughput, goodput, latency p50/p99, occupancy, KV usage."""
    t = Table(title=title, title_style="bold")
    t.add_column("metric")
    for name in summaries:
        t.add_column(name, justify="right")
    base = summaries.get("static")

    def row(label: str, fn) -> None:
        t.add_row(label, *[fn(s) for s in summaries.values()])

    def server(s: dict, field: str, stat: str = "mean") -> float | None:
        d = (s.get("telemetry") or {}).get("server") or {}
        v = d.get(field)
        return v.get(stat) if isinstance(v, dict) else None

    row("requests ok / sent", lambda s: f"{s['counts']['completed']}/{s['counts']['total']}")
    row("duration (s)", lambda s: _f(s["duration_s"], "{:.1f}"))
    row("throughput (req/s)", lambda s: _f(s["request_throughput"], "{:.3f}"))
    row("throughput (output tok/s)", lambda s: _f(s["output_throughput"], "{:.1f}"))
    if base and base.get("output_throughput"):
        row(
            "output tok/s vs static",
            lambda s: _f((s["output_throughput"] or 0) / base["output_throughput"], "{:.2f}x"),
        )
    row(
        "goodput (req/s within SLO)",
        lambda s: _f((s.get("goodput") or {}).get("requests_per_s"), "{:.3f}"),
    )
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E")):
        for p in ("p50", "p99"):
            row(f"{label} {p} (ms)", lambda s, key=key, p=p: _ms(s[key][p]))
    if base and base["e2e_s"]["p99"]:
        row(
            "E2E p99 vs static",
            lambda s: _f((s["e2e_s"]["p99"] or 0) / base["e2e_s"]["p99"], "{:.2f}x"),
        )
    plain = summaries.get("continuous")
    if "continuous+spec" in summaries and plain and plain.get("output_throughput"):
        row(
            "output tok/s vs continuous",
            lambda s: _f((s["output_throughput"] or 0) / plain["output_throughput"], "{:.2f}x"),
        )

        def spec(s: dict, field: str):
            return ((s.get("telemetry") or {}).get("server") or {}).get(field)

        row("spec: draft acceptance", lambda s: _f(spec(s, "spec_acceptance_rate"), "{:.0%}"))
        row("spec: tokens per step", lambda s: _f(spec(s, "spec_mean_accepted_length")))
    row("batch occupancy (mean)", lambda s: _f(server(s, "batch_occupancy"), "{:.0%}"))
    row(
        "KV usage mean / max",
        lambda s: (
            f"{_f(server(s, 'kv_usage'), '{:.0%}')} / {_f(server(s, 'kv_usage', 'max'), '{:.0%}')}"
        ),
    )
    row("errors", lambda s: str(s["counts"]["failed"]))
    slo = next(iter(summaries.values())).get("goodput") or {}
    if slo.get("slo_s"):
        t.caption = "goodput SLOs: " + ", ".join(f"{k} <= {v:g}s" for k, v in slo["slo_s"].items())
    return t


if __name__ == "__main__":
    from cbbench.harness.cli import main

    sys.exit(main(["run", *sys.argv[1:]]))
