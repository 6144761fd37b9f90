"""`cbbench import SOURCE --out RUN [--format NAME]`: another tool's results as a run folder."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    from cbbench.harness.results.formats import FORMATS

    p = sub.add_parser(
        "import",
        help="read another tool's results (vllm bench, guidellm, AIPerf, inference-perf, "
        "llm-d benchmark report) into a run folder",
        description="Read a result file (or a tool's output folder) into a run folder that "
        "report, gate and diagnose read: per-request data become records (what the source "
        "lacks stays empty), aggregate-only sources a summary marked 'imported, aggregate "
        "only'. The format is detected from the file. A file of several benchmarks (a "
        "guidellm sweep) becomes a folder of runs, one per benchmark.",
    )
    p.add_argument("source", metavar="SOURCE", help="result file or output folder")
    p.add_argument("--out", required=True, metavar="RUN", help="run folder to write")
    p.add_argument("--format", choices=list(FORMATS), help="force the format")
    p.add_argument(
        "--workload",
        metavar="NAME",
        help="the workload it ran, as cbbench names it (e.g. fixed-64-32), so report and gate "
        "hold it against cbbench runs of that workload (other tools do not record one)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cbbench.harness.results.formats import read_source
    from cbbench.harness.results.formats.imported import write_all

    runs, fmt, path = read_source(args.source, args.format)
    if args.workload:
        for imp in runs:
            imp.workload["name"] = args.workload
    for folder, imp in write_all(runs, path, fmt, Path(args.out), ["cbbench", *sys.argv[1:]]):
        what = (
            f"{len(imp.records)} records"
            if imp.records
            else "aggregate only (no per-request data: a gate compares point estimates)"
        )
        version = imp.version or "(version not in the file)"
        print(f"{path}: {imp.tool} {version} ({fmt}), {what} -> {folder}")
        if any(r.sent_s is None for r in imp.records if r.ok):
            print("  no per-request send times in the file: report and gate read it; "
                  "calibrate --from-run rebuilds them only where the load fixes them")  # fmt: skip
    for d in runs[0].definitions if runs else []:
        print(f"  definition differs: {d}")
    return 0
