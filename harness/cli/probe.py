"""`cbbench probe --base-url URL`: characterise a black-box server (batching kind, effective
maximum batch, prefix caching, chunked prefill) with a short designed workload."""

from __future__ import annotations

import argparse
from pathlib import Path

from cbbench.harness.durations import seconds_arg


def register(sub: argparse._SubParsersAction) -> None:
    from cbbench.harness.probe import PHASES

    p = sub.add_parser(
        "probe",
        help="characterise a black-box server: batching, max batch, prefix caching, chunking",
        description="Send a short designed workload and infer, with evidence and a confidence, "
        "how the server batches (request- or iteration-level; static or dynamic), its "
        "effective maximum batch, and whether prefix caching and chunked prefill are on. "
        "Writes a folder of run folders plus probe.json.",
    )
    p.add_argument("--base-url", required=True, help="server root, e.g. http://127.0.0.1:8000")
    p.add_argument("--out", help="probe folder (default results/probes/<timestamp>)")
    p.add_argument("--model", help="model name (default: the first one /v1/models lists)")
    p.add_argument("--api-key", help="sent as a Bearer token")
    p.add_argument("--max-requests", type=int, default=400, help="request budget (default 400)")
    p.add_argument("--max-time", type=seconds_arg, default=180.0, help="time budget (default 3m)")
    p.add_argument(
        "--phases",
        default=",".join(PHASES),
        help=f"comma-separated subset of {','.join(PHASES)} (calibration always runs)",
    )
    p.add_argument("--no-server-metrics", action="store_true", help="do not scrape /metrics")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import datetime as dt

    from cbbench.harness.errors import CbbenchError
    from cbbench.harness.probe import ProbeConfig, run_probe

    if args.max_requests < 10 or args.max_time <= 0:
        raise CbbenchError("--max-requests must be >= 10 and --max-time positive")
    out = (
        Path(args.out)
        if args.out
        else Path("results/probes") / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    )
    cfg = ProbeConfig(
        base_url=args.base_url.rstrip("/"),
        out_dir=out,
        model=args.model,
        api_key=args.api_key,
        max_requests=args.max_requests,
        max_time_s=args.max_time,
        phases=tuple(x.strip() for x in args.phases.split(",") if x.strip()),
        server_metrics=not args.no_server_metrics,
    )
    result = run_probe(cfg)
    for v in result.verdicts:
        print(f"{v.name}: {v.text}  [confidence {v.confidence:.2f}, {v.confidence_label}]")
        for e in v.evidence:
            print(f"  - {e}")
    for s in result.skipped:
        print(f"skipped {s}")
    print(f"{result.requests} requests in {result.wall_s:.1f} s; probe folder: {result.out_dir}")
    return 0
