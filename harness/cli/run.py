"""`cbbench run`: the one-command demo. Once per scheduler (static, dynamic, continuous), start
the reference engine's server, replay one workload against it over HTTP with the load
generator and telemetry on, then print the runs side by side and write an HTML report.

Same model, same KV pool, same batch size B (static batch size = dynamic max batch size =
continuous max_num_seqs), same requests: only the batching policy changes. `--sim HARDWARE`
runs the same comparison in the simulator instead (in-process, virtual time, SIMULATED).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

from cbbench.harness.errors import CbbenchError
from cbbench.harness.summary import parse_slo
from rich.console import Console
from rich.table import Table

SCHEDULERS = ("static", "dynamic", "continuous")
DEFAULT_BATCH_SIZE = 8
DEFAULT_SLO = "ttft=10s,tpot=100ms"
DEFAULT_SIM_MODEL = "llama-3-8b"
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
# Engine flags handled here rather than forwarded as given.
_OWN_DESTS = {"model", "device", "scheduler", "executor", "hardware", "seed", "batch_size"}
_PER_SCHEDULER = {"max_batch_size", "max_num_seqs"}


def _engine_parser() -> argparse.ArgumentParser:
    from cbbench.harness.cli.serve import add_engine_args

    p = argparse.ArgumentParser(add_help=False)
    add_engine_args(p)
    return p


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        parents=[_engine_parser()],
        conflict_handler="resolve",  # the flags below replace add_engine_args' versions
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
    p.add_argument("--seed", type=int, default=0, help="workload and engine seed")
    p.add_argument(
        "--schedulers",
        "--scheduler",
        dest="schedulers",
        default=",".join(SCHEDULERS),
        help="comma list (default: static,dynamic,continuous)",
    )
    p.add_argument(
        "--model",
        default=None,
        help=f"preset or HF model folder (default: tiny; with --sim: {DEFAULT_SIM_MODEL})",
    )
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda if present)")
    p.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help="B: static batch size, dynamic max batch size and continuous max_num_seqs "
        f"(default {DEFAULT_BATCH_SIZE}; --max-batch-size / --max-num-seqs override)",
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
        "--sim",
        metavar="HARDWARE",
        default=None,
        help="simulate instead (h100, a100-80g, h200, cpu-measured, steps or a calibrate JSON)",
    )
    p.add_argument("--executor", help=argparse.SUPPRESS)  # replaced by --sim
    p.add_argument("--hardware", help=argparse.SUPPRESS)  # replaced by --sim
    p.add_argument("--out", default=None, help="parent folder (default results/runs/<time>-run)")
    p.add_argument("--no-report", action="store_true", help="skip the HTML report")
    p.add_argument("--no-live", action="store_true", help="no live view during each run")
    p.set_defaults(func=run)


def _schedulers(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in SCHEDULERS]
    if bad or not names:
        raise CbbenchError(
            f"--schedulers: unknown {bad or text!r} (choose from {', '.join(SCHEDULERS)})"
        )
    return list(dict.fromkeys(names))


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def engine_flags(args: argparse.Namespace, scheduler: str) -> list[str]:
    """`cbbench serve` flags for one scheduler: every engine flag given, plus B."""
    out: list[str] = []
    for a in _engine_parser()._actions:
        if not a.option_strings or a.dest in _OWN_DESTS | _PER_SCHEDULER:
            continue
        v = getattr(args, a.dest, None)
        opt = a.option_strings[0]
        if v is None:
            continue
        if isinstance(a, argparse.BooleanOptionalAction):
            out.append(opt if v else "--no-" + opt[2:])
        elif isinstance(v, bool):
            if v:
                out.append(opt)
        elif isinstance(v, tuple):
            out += [opt, ",".join(str(x) for x in v)]
        else:
            out += [opt, str(v)]
    b = args.batch_size
    if scheduler == "static":
        out += ["--batch-size", str(b)]
    elif scheduler == "dynamic":
        out += ["--max-batch-size", str(args.max_batch_size or b)]
    else:
        out += ["--max-num-seqs", str(args.max_num_seqs or b)]
    out += ["--seed", str(args.seed)]
    return out


def _parent_dir(args: argparse.Namespace) -> Path:
    if args.out:
        parent = Path(args.out)
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


def _workload_spec(args: argparse.Namespace, parent: Path) -> str:
    """The workload as a spec string: the default one is written next to the runs."""
    if args.workload:
        return args.workload
    path = parent / "workload.json"
    path.write_text(json.dumps(RUN_WORKLOAD, indent=2) + "\n", encoding="utf-8")
    return str(path)


def _check(args: argparse.Namespace) -> None:
    for flag, v in (("--batch-size", args.batch_size), ("--num-requests", args.num_requests)):
        if v is not None and v < 1:
            raise CbbenchError(f"{flag} must be >= 1, got {v}")
    if args.concurrency is not None and args.concurrency < 1:
        raise CbbenchError(f"--concurrency must be >= 1, got {args.concurrency}")
    if args.rate is not None and args.rate <= 0:
        raise CbbenchError(f"--rate must be > 0, got {args.rate}")
    parse_slo(args.slo)


def run(args: argparse.Namespace) -> int:
    names = _schedulers(args.schedulers)
    _check(args)
    if args.executor == "sim" and not args.sim:
        args.sim = args.hardware or "h100"
    if args.workload:  # a bad spec fails before any folder is made
        from cbbench.workloads import load_workload

        load_workload(args.workload, seed=args.seed, num_requests=args.num_requests)
    console = Console()
    parent = _parent_dir(args)
    spec = _workload_spec(args, parent)
    if args.sim:
        from cbbench.harness.run_demo import run_simulated

        dirs = run_simulated(args, names, spec, parent, console)
        interrupted = False
    else:
        from cbbench.harness.run_demo import run_measured

        dirs, results, interrupted = run_measured(args, names, spec, parent, console)
        if results:
            console.print(comparison_table(results, _title(args)))
    if dirs and not args.no_report:
        _write_report(dirs, parent / "report.html", console)
    console.print(f"run folders: {parent}/{{{','.join(d.name for d in dirs)}}}")
    return 130 if interrupted else 0


def _title(args: argparse.Namespace) -> str:
    wl = args.workload or RUN_WORKLOAD["name"]
    return (
        f"MEASURED over HTTP: {args.model or 'tiny'} on {args.device}, workload {wl}, "
        f"B={args.batch_size} (same KV pool for every scheduler)"
    )


def _write_report(dirs: list[Path], path: Path, console: Console) -> None:
    from cbbench.harness.report import build_report

    html = build_report([str(d) for d in dirs]).html()
    path.write_text(html, encoding="utf-8")
    console.print(f"report: {path}")


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
