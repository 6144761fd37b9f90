"""`cbbench report RUN_DIR...`: a self-contained HTML report (and Markdown) comparing runs."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cbbench.harness.cli.parsing import old_spelling
from cbbench.harness.errors import CbbenchError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="compare run folders in one self-contained HTML report (and Markdown)",
        description="Compare run folders (a sweep folder expands to its load levels) in one "
        "HTML file that opens offline, and optionally a Markdown summary for a PR comment.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders or sweep folders")
    p.add_argument("--out", dest="output", default="report.html",
                   help="HTML file (default: report.html; -o/--output: old spelling)")  # fmt: skip
    old_spelling(p, "-o", "--out")
    old_spelling(p, "--output", "--out")
    p.add_argument("--markdown", metavar="FILE", help="also write a Markdown summary here")
    p.add_argument("--no-html", action="store_true", help="write only the Markdown summary")
    p.set_defaults(func=run)


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise CbbenchError(f"{path}: cannot write ({exc.strerror})") from None


def run(args: argparse.Namespace) -> int:
    from cbbench.harness.report import build_report

    if args.no_html and not args.markdown:
        raise CbbenchError("--no-html needs --markdown FILE")
    report = build_report(args.runs)
    for warning in report.comparability_warnings():
        print(f"cbbench report: warning: not comparable: {warning}", file=sys.stderr)
    for warning in report.comparability_warnings("caution"):
        print(f"cbbench report: read with care: {warning}", file=sys.stderr)
    for warning in report.trust_warnings():
        print(f"cbbench report: warning: {warning}", file=sys.stderr)
    if not args.no_html:
        html = report.html()
        _write(Path(args.output), html)
        print(f"wrote {args.output} ({len(report.runs)} runs, {len(html.encode()) / 1024:.0f} KiB)")
    if args.markdown:
        _write(Path(args.markdown), report.markdown())
        print(f"wrote {args.markdown}")
    return 0
