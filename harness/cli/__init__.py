"""`cbbench` command line: one argparse parser, one module per subcommand.

argparse keeps start-up fast and adds no dependency; each subcommand module exposes
`register(subparsers)` that adds its parser with `set_defaults(func=run)` and a
`run(args) -> int`. `main` imports only the command it runs: the others are listed from
COMMAND_HELP (kept equal to each module's own help by tests/test_cli_startup.py), so
`cbbench --help` and `cbbench sim --help` import no torch, numpy, httpx or Locust.

Layer: commands (the top).
Imports: anything; nothing imports a command module.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from cbbench.harness.cli.parsing import (
    CommandParser,
    describe_commands,
    print_old_spelling_notes,
)
from cbbench.reference_engine.server.lifeline import die_with_launcher

# Subcommand modules, in the order `cbbench --help` lists them.
COMMAND_MODULES: list[str] = [
    "cbbench.harness.cli.version",
    "cbbench.harness.cli.run",
    "cbbench.harness.cli.reproduce",
    "cbbench.harness.cli.compare_engines",
    "cbbench.harness.cli.quality",
    "cbbench.harness.cli.bench",
    "cbbench.harness.cli.merge",
    "cbbench.harness.cli.locust",
    "cbbench.harness.cli.export",
    "cbbench.harness.cli.import_",
    "cbbench.harness.cli.selftest",
    "cbbench.harness.cli.workload",
    "cbbench.harness.cli.report",
    "cbbench.harness.cli.diagnose",
    "cbbench.harness.cli.probe",
    "cbbench.harness.cli.gate",
    "cbbench.harness.cli.sweep",
    "cbbench.harness.cli.serve",
    "cbbench.harness.cli.route",
    "cbbench.harness.cli.sim",
    "cbbench.harness.cli.calibrate",
    "cbbench.harness.cli.plan",
]

# One-line help of each command, as its module registers it (listed without importing it).
COMMAND_HELP: dict[str, str] = {
    "version": "print cbbench's version and its key dependencies",
    "run": "the demo: static vs dynamic vs continuous batching on the reference engine",
    "reproduce": "regenerate the seeds' figures: seed-demo timeline, static vs continuous gains "
    "(about 26 min on 2 CPU cores; --sim-only 3 min)",
    "compare-engines": "reference engine vs transformers (static, continuous) vs vLLM on CPU: "
    "tokens/s",
    "quality": "accuracy of bf16/fp16 weights and quantized KV caches vs fp32",
    "bench": "replay a workload against an OpenAI-compatible server and record every request",
    "merge": "merge the run folders of `bench --shard I/N` hosts into one run folder",
    "locust": "load through Locust: web UI or headless, distributed workers, same run folder",
    "export": "write a run's records as CSV or Parquet, or it as an llm-d benchmark report",
    "import": "read another tool's results (vllm bench, guidellm, AIPerf, inference-perf, "
    "llm-d benchmark report) into a run folder",
    "selftest": "measure the client's own ceiling and timing error locally",
    "workload": "list, show and convert workloads (presets, traces, specs)",
    "report": "compare run folders in one self-contained HTML report (and Markdown)",
    "diagnose": "explain a run: findings with evidence and the fix in each engine's flags",
    "probe": "characterise a black-box server: batching, max batch, prefix caching, chunking",
    "gate": "fail CI on a statistically clear regression between two runs",
    "sweep": "benchmark a server at several load levels into one folder (for report curves)",
    "serve": "serve the reference engine over an OpenAI-compatible HTTP API",
    "route": "route OpenAI requests across engine replicas (a global scheduler)",
    "sim": "compare static / dynamic / continuous batching in simulated time",
    "calibrate": "fit the simulator's cost model to measured reference-engine step times",
    "plan": "the cheapest simulated configuration (replicas, batching) that meets an SLO",
}


def command_name(module: str) -> str:
    return module.rsplit(".", 1)[1].rstrip("_").replace("_", "-")  # import_ -> import


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


def build_parser(only: str | None = "") -> argparse.ArgumentParser:
    """The parser. By default every command module is imported and registered; with `only`
    set, just that one is (the others are listed by name and help, and `only=None` imports
    none: enough for `cbbench --help`)."""
    parser = CommandParser(
        prog="cbbench",
        description="Benchmark LLM inference servers; compare static, dynamic and continuous batching.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        name = command_name(module)
        lazy = only != "" and name != only and name in COMMAND_HELP
        if lazy:
            sub.add_parser(name, help=COMMAND_HELP[name], add_help=False)
        else:
            importlib.import_module(module).register(sub)
    describe_commands(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    die_with_launcher()  # started by the harness's launcher: go when it goes
    argv = list(sys.argv[1:] if argv is None else argv)
    names = {command_name(m) for m in COMMAND_MODULES}
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only=command if command in names else None)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the command's own parser: `cbbench report: error: ...`
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        cmd = sub.choices.get(getattr(args, "command", None) or "", parser)
        cmd.error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    print_old_spelling_notes(f"cbbench {args.command}", argv)
    errors = _user_error_types()
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except errors as exc:  # type: ignore[misc]
        print(f"cbbench {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # out of file descriptors (EMFILE), or a path the user gave
        from cbbench.harness.errors import resource_hint

        if resource_hint(exc):
            print(f"cbbench {args.command}: error: {exc}{resource_hint(exc)}", file=sys.stderr)
            return 1
        if exc.filename is None:
            raise
        print(f"cbbench {args.command}: error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
