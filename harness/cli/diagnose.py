"""`cbbench diagnose RUN [RUN...]`: rules over run folders' records and telemetry; each finding
with its evidence and the fix in each engine's own flags."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diagnose",
        help="explain a run: findings with evidence and the fix in each engine's flags",
        description="Apply the diagnosis rules (KV pressure, batch caps, under-load, head-of-line "
        "blocking, batching delay, prefill stalls, length skew, client bottleneck) to run folders "
        "(a sweep folder expands to its levels). Exit 0 either way; --strict exits 1 on a "
        "warning.",
    )
    p.add_argument("runs", nargs="*", metavar="RUN_DIR", help="run folders or sweep folders")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--rules", help="only these rules, comma-separated (see --list-rules)")
    p.add_argument("--list-rules", action="store_true", help="list the rules and exit")
    p.add_argument(
        "--all-engines",
        action="store_true",
        help="show the fix for every engine, not only the run's",
    )
    p.add_argument("--strict", action="store_true", help="exit 1 when a warning is found")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cbbench.harness.diagnose import RULES, diagnose_run, select_rules
    from cbbench.harness.diagnose.render import text
    from cbbench.harness.errors import CbbenchError
    from cbbench.harness.report.runs import load_runs

    if args.list_rules:
        for r in RULES:
            print(f"{r.id:16} {r.symptom}")
        return 0
    if not args.runs:
        raise CbbenchError("give at least one run folder (or --list-rules)")
    rules = select_rules([x.strip() for x in args.rules.split(",")] if args.rules else None)
    diags = [diagnose_run(lr.run, lr.label, rules) for lr in load_runs(args.runs)]
    if args.json:
        print(json.dumps([d.to_dict() for d in diags], indent=2, default=str))
    else:
        print(text(diags, args.all_engines), end="")
    warn = any(f.severity == "warning" for d in diags for f in d.findings)
    return 1 if args.strict and warn else 0
