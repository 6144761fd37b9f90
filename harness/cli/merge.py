"""`cbbench merge --out OUT DIR...`: the shard run folders of one N-host run (`cbbench bench --shard
I/N`) into one run folder, its summary recomputed from the merged records."""

from __future__ import annotations

import argparse
import sys

from cbbench.harness.errors import CbbenchError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "merge",
        help="merge the run folders of `bench --shard I/N` hosts into one run folder",
        description=__doc__,
    )
    p.add_argument(
        "--out",
        metavar="OUT",
        help="the merged run folder (must not hold a run); the old form `merge OUT DIR...` "
        "still works",
    )
    p.add_argument("dirs", metavar="DIR", nargs="+", help="one run folder per shard")
    p.add_argument(
        "--allow-missing",
        action="store_true",
        help="merge even if some shards' folders are not given (the summary lists them)",
    )
    p.add_argument(
        "--allow-start-skew",
        action="store_true",
        help="merge shards started more than 0.25 s apart without a common --start-at "
        "(refused by default: their loads overlapped only in part)",
    )
    p.add_argument("--name", help="run name (default: the shards')")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cbbench.harness.conclusions.merge_window import merge_with_window
    from cbbench.harness.conclusions.run_summary import conclusion_lines
    from cbbench.harness.console.live import print_summary
    from cbbench.harness.console.window_table import window_table
    from cbbench.harness.load.runner import worker_timing_lines
    from cbbench.harness.results.agent_summary import cache_lines
    from rich.console import Console

    if args.out is None:  # the old form: merge OUT DIR...
        if len(args.dirs) < 2:
            raise CbbenchError("give the merged folder: --out OUT DIR...")
        args.out, args.dirs = args.dirs[0], args.dirs[1:]
        print(
            "cbbench merge: note: `merge OUT DIR...` is the old form of `merge --out OUT "
            "DIR...` (still accepted)",
            file=sys.stderr,
        )
    res = merge_with_window(
        args.out, args.dirs, allow_missing=args.allow_missing, name=args.name, command=sys.argv,
        allow_start_skew=args.allow_start_skew,
    )  # fmt: skip
    out = Console(soft_wrap=True)
    count = res.meta["merged"]["shards"]
    if res.missing:
        names = ", ".join(f"{i}/{count}" for i in res.missing)
        print(f"cbbench merge: warning: merged without shard(s) {names}", file=sys.stderr)
    if res.meta["merged"].get("start_skew"):
        print(f"cbbench merge: warning: {res.meta['merged']['start_skew']}", file=sys.stderr)
    print_summary(out, res.summary, f"cbbench merge: {res.meta['name']}")
    windowed = window_table(res.summary)  # the merged run's steady window beside it
    if windowed is not None:
        out.print(windowed)
    for line in [*worker_timing_lines(res.summary), *cache_lines(res.summary),
                 *conclusion_lines(res.summary, window_table=windowed is not None)]:  # fmt: skip
        out.print(line, highlight=False, soft_wrap=True)
    for row in res.summary["shards"]:
        late = row["late_start_s"] or 0.0
        start = (  # late against --start-at; without one, its offset from the first shard
            f"started {late * 1e3:.1f} ms late"
            if res.meta["clock"].get("start_at_unix_s") is not None
            else f"started +{row['shift_s']:.3f} s after the first shard"
        )
        out.print(
            f"shard {row['shard']}/{count}: {row['recorded']} of {row['requests']} requests "
            f"recorded, workers {row['workers']}, {start}",
            highlight=False,
            soft_wrap=True,  # whole lines, not cut mid-phrase
        )
    merged = res.meta["merged"]["merged"]
    out.print(f"merged {len(merged)} shard(s), {len(res.records)} records: {res.run_dir}")
    return 0
