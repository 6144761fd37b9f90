"""`cbbench` command line: one argparse parser, one module per subcommand.

argparse keeps start-up fast (no extra import cost for `--help` or shell completion) and
adds no dependency; each subcommand module exposes `register(subparsers)` that adds its
parser with `set_defaults(func=run)` and a `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Subcommand modules, in the order `cbbench --help` lists them.
COMMAND_MODULES: list[str] = [
    "cbbench.harness.cli.version",
    "cbbench.harness.cli.run",
    "cbbench.harness.cli.reproduce",
    "cbbench.harness.cli.compare_engines",
    "cbbench.harness.cli.bench",
    "cbbench.harness.cli.locust",
    "cbbench.harness.cli.export",
    "cbbench.harness.cli.selftest",
    "cbbench.harness.cli.workload",
    "cbbench.harness.cli.report",
    "cbbench.harness.cli.diagnose",
    "cbbench.harness.cli.probe",
    "cbbench.harness.cli.gate",
    "cbbench.harness.cli.sweep",
    "cbbench.harness.cli.serve",
    "cbbench.harness.cli.sim",
    "cbbench.harness.cli.calibrate",
]

# User-caused errors: one clear line and a non-zero exit, never a traceback.
USER_ERROR_TYPES = (
    "cbbench.harness.errors:CbbenchError",
    "cbbench.workloads.errors:WorkloadError",
    "cbbench.reference_engine.errors:EngineError",
)


def _user_error_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = []
    for ref in USER_ERROR_TYPES:
        mod, _, name = ref.partition(":")
        try:
            types.append(getattr(importlib.import_module(mod), name))
        except (ImportError, AttributeError):
            continue
    return tuple(types)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cbbench",
        description="Benchmark LLM inference servers; compare static, dynamic and continuous batching.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    errors = _user_error_types()
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except errors as exc:  # type: ignore[misc]
        print(f"cbbench {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
