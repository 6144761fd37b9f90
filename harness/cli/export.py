"""`cbbench export RUN --csv PATH | --parquet PATH | --benchmark-report PATH`.

CSV / Parquet: a run's records as a table (pandas), one row per request; list fields
(token_times_s, itl_s, stream_flags) and `extra` are kept as JSON text in CSV, as
lists/structs in Parquet. `--benchmark-report`: the run as an llm-d benchmark report v0.2.1
(JSON, or YAML by the suffix); a sweep folder gives one report per load level.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cbbench.harness.errors import CbbenchError
from cbbench.harness.results.integrity import trust_problems
from cbbench.harness.results.run_folder import load_run


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a run's records as CSV or Parquet, or it as an llm-d benchmark report",
    )
    p.add_argument("run", help="run folder (holds requests.jsonl); a sweep folder for reports")
    fmt = p.add_mutually_exclusive_group(required=True)
    fmt.add_argument("--csv", help="output CSV path")
    fmt.add_argument("--parquet", help="output Parquet path (needs pyarrow)")
    fmt.add_argument(
        "--benchmark-report",
        metavar="PATH",
        help="llm-d benchmark report v0.2.1, JSON or YAML by suffix (.json, .yaml)",
    )
    fmt.add_argument(
        "--out",
        metavar="PATH",
        help="output path, the format from its suffix: .csv, .parquet, or .json/.yaml (the "
        "llm-d benchmark report); the same as the flag of that format",
    )
    p.set_defaults(func=run)


# --out's suffix -> the format flag's dest it stands for
SUFFIX_FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".json":
                  "benchmark_report", ".yaml": "benchmark_report", ".yml": "benchmark_report"}  # fmt: skip


def _format_of_out(args: argparse.Namespace) -> None:
    """`--out x.csv` is `--csv x.csv` (and so on by suffix); an unknown suffix is one line."""
    if not args.out:
        return
    dest = SUFFIX_FORMATS.get(Path(args.out).suffix.lower())
    if dest is None:
        raise CbbenchError(
            f"--out {args.out}: cannot tell the format from the suffix {Path(args.out).suffix!r}"
            f"; end it in .csv, .parquet, .json or .yaml (or give --csv/--parquet/"
            f"--benchmark-report)"
        )
    setattr(args, dest, args.out)


def run(args: argparse.Namespace) -> int:
    _format_of_out(args)
    if args.benchmark_report:
        from cbbench.harness.results.formats.export import export_benchmark_reports

        for line in export_benchmark_reports(args.run, args.benchmark_report):
            if line.startswith("warning: "):  # exported anyway: the reader must know
                print(f"cbbench export: {line}", file=sys.stderr)
            else:
                print(line)
        return 0
    run_ = load_run(args.run)
    for problem in trust_problems(run_):  # exported anyway: the reader must know
        print(f"cbbench export: warning: {args.run} is {problem}", file=sys.stderr)
    df = run_.dataframe()
    out = Path(args.csv or args.parquet)
    if out.parent and not out.parent.exists():
        raise CbbenchError(f"{out}: folder {out.parent} does not exist")
    if args.csv:
        for col in ("token_times_s", "itl_s", "stream_flags", "extra"):
            if col in df:
                df[col] = df[col].map(lambda v: json.dumps(v, separators=(",", ":")))
        df.to_csv(out, index=False)
    else:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise CbbenchError(
                "--parquet needs pyarrow, which cbbench does not install: pip install "
                "'pyarrow>=14' (or write --csv)"
            ) from None
        if "extra" in df:  # free-form dicts have no fixed Parquet schema: keep them as JSON
            df["extra"] = df["extra"].map(lambda v: json.dumps(v, separators=(",", ":")))
        df.to_parquet(out, index=False)
    print(f"{len(df)} records -> {out}")
    return 0
