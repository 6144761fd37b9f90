"""`cbbench bench`: replay a workload against an OpenAI-compatible server, vLLM-bench style."""

from __future__ import annotations

import argparse
import sys

from cbbench.harness.client.endpoints import ENDPOINTS
from cbbench.harness.client.stream_kinds import REASONING_PARSERS
from cbbench.harness.durations import seconds_arg
from cbbench.harness.load.cache_options import add_cache_args
from cbbench.harness.load.rigor_options import add_rigor_args
from cbbench.harness.load.vllm_compat import RANDOM_INPUT_LEN, RANDOM_OUTPUT_LEN
from cbbench.harness.results.slo import SLO_HELP
from cbbench.harness.telemetry import TelemetryOptions


def add_load_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", required=True, help="server root, e.g. http://127.0.0.1:8000")
    p.add_argument(
        "--workload",
        default=None,
        help="preset name, trace file, spec file, or fixed lengths prompt=N,output=M "
        "(default: mixed)",
    )
    p.add_argument(
        "--random-input-len",
        type=int,
        metavar="N",
        help=f"vLLM's spelling: every prompt N tokens (default {RANDOM_INPUT_LEN} when only "
        "--random-output-len is given); same as --workload prompt=N,output=M",
    )
    p.add_argument(
        "--random-output-len",
        type=int,
        metavar="M",
        help=f"vLLM's spelling: every output M tokens (default {RANDOM_OUTPUT_LEN} when only "
        "--random-input-len is given)",
    )
    p.add_argument(
        "--endpoint",
        choices=ENDPOINTS,
        default="completions",
        help="API to call: /v1/completions, /v1/chat/completions, /v1/responses, /v1/messages "
        "(Anthropic) or /v1/embeddings (default: completions)",
    )
    p.add_argument("--model", help="model name (default: the first one /v1/models lists)")
    p.add_argument(
        "--embeddings-batch",
        type=int,
        default=1,
        help="--endpoint embeddings: inputs per request (made from the request's prompt)",
    )
    rate = p.add_mutually_exclusive_group()
    rate.add_argument(
        "--request-rate",
        "--rate",
        dest="rate",
        type=float,
        help="requests/s, open loop (inf = all at once); default: the workload's own arrival "
        "times, else closed loop",
    )
    p.add_argument(
        "--burstiness",
        type=float,
        default=None,
        help="gamma shape of the arrival gaps as in vLLM: 1 = Poisson, < 1 burstier; needs "
        "--rate (default: 1)",
    )
    p.add_argument("--arrival", choices=("poisson", "constant"), help="arrival kind for --rate")
    p.add_argument(
        "--concurrency",
        "--max-concurrency",
        dest="concurrency",
        type=int,
        help="closed loop: requests in flight; with open loop: a cap (slot wait = client queue)",
    )
    p.add_argument(
        "--cap-unit",
        choices=("sessions", "requests"),
        default="sessions",
        help="multi-turn workloads: --concurrency counts sessions (a slot held from the first "
        "turn to the last reply, default) or requests in flight",
    )
    p.add_argument(
        "--num-requests",
        "--num-prompts",
        dest="num_requests",
        type=int,
        metavar="N",
        help="send the workload's first N requests (default: the workload's own count, "
        "200 for the synthetic presets, every row of a trace); with --duration, the run "
        "stops at whichever comes first",
    )
    p.add_argument(
        "--duration",
        metavar="DURATION",
        help="stop sending new requests after this long (60s, 2m; a bare number is seconds); "
        "with --num-requests, whichever comes first",
    )
    p.add_argument(
        "--warmup",
        type=int,
        metavar="N",
        default=0,
        help="send the workload's first N requests once before the run, left out of the "
        "summary (default: 0)",
    )
    p.add_argument(
        "--seed", type=int, default=None, help="workload seed (default: the spec file's, else 0)"
    )
    slo = p.add_mutually_exclusive_group()
    slo.add_argument("--slo", help=SLO_HELP + " (default: none)")
    slo.add_argument(
        "--goodput",
        nargs="+",
        metavar="KEY:MS",
        help="vLLM's spelling of --slo, in milliseconds: --goodput ttft:200 tpot:50 e2el:10000",
    )
    p.add_argument("--tokenizer", help="tokenizer.json (or its folder): exact-length text prompts")
    p.add_argument(
        "--text-prompts", action="store_true", help="send text, not token ids, on completions"
    )
    p.add_argument("--api-key", help="sent as a Bearer token")
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        default=1,
        help="load-generator processes; add some when the run says CLIENT-BOUND (default: 1)",
    )
    p.add_argument(
        "--shard",
        metavar="I/N",
        help="send only part I (0-based) of the workload split N ways, as worker I of "
        "--workers N would: one part per host, then `cbbench merge` (docs/benchmarking.md)",
    )
    p.add_argument(
        "--start-at",
        metavar="T",
        help="start (t0) at this wall-clock time, unix seconds or ISO with zone "
        "(2026-12-03T14:00:00Z), at most 1 h ahead: every host's arrival times line up",
    )
    p.add_argument(
        "--timeout",
        type=seconds_arg,
        metavar="DURATION",
        default=600.0,
        help="how long a request may take before it is failed as a timeout (10m, 90s; a bare "
        "number is seconds; default: 600s)",
    )
    p.add_argument("--no-stream", action="store_true", help="non-streaming requests (no TTFT/ITL)")
    p.add_argument(
        "--no-extensions",
        action="store_true",
        help="plain OpenAI body: no ignore_eos, min_tokens, return_token_ids, priority",
    )
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="vLLM's flag: generate every asked token; sent by default, and alone with "
        "--no-extensions",
    )
    p.add_argument(
        "--http-client",
        choices=("raw", "httpx"),
        default="raw",
        help="HTTP/1.1 transport: raw asyncio (default, lowest overhead) or httpx",
    )
    p.add_argument(
        "--no-prewarm",
        action="store_true",
        help="do not open the connections before t0 (measure cold starts on purpose; each "
        "request's set-up time is in connect_s, never in TTFT)",
    )
    p.add_argument(
        "--user-timestamps",
        action="store_true",
        help="stamp arrivals in user space, not with the kernel's receive time (raw client)",
    )
    p.add_argument("--extra-body", help="JSON object merged into every request body")
    add_cache_args(p)  # --flush-cache, --prime, --session-header
    add_reasoning_args(p)
    p.add_argument("--out", help="run folder (default results/runs/<timestamp>-<name>)")
    p.add_argument("--name", help="run name (default: the workload's)")
    p.add_argument("--no-live", action="store_true", help="no live view, only the final table")


def add_reasoning_args(p: argparse.ArgumentParser) -> None:
    """Reasoning models (docs/benchmarking.md): bench and sweep."""
    p.add_argument(
        "--reasoning-parser",
        choices=REASONING_PARSERS,
        default="auto",
        help="where a stream's reasoning is: auto (the reasoning / reasoning_content fields, "
        "or content opening with <think>), think-tags (output starts thinking until </think>), "
        "none (every token is answer: TTFO = TTFT)",
    )
    p.add_argument(
        "--reasoning-effort",
        choices=("minimal", "low", "medium", "high"),
        help="chat: sent as reasoning_effort (OpenAI, vLLM's gpt-oss)",
    )
    p.add_argument(
        "--chat-template-kwargs",
        metavar="JSON",
        help="chat: sent as chat_template_kwargs, e.g. '{\"enable_thinking\": false}' (Qwen3)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="replay a workload against an OpenAI-compatible server and record every request",
        description=__doc__,
    )
    add_load_args(p)
    add_rigor_args(p)  # --window, --on-saturation, --repeats, --scenario (docs/rigor.md)
    TelemetryOptions.add_args(p)
    p.add_argument(
        "--benchmark-report",
        metavar="PATH",
        help="also write the run as an llm-d benchmark report v0.2.1 (.json or .yaml)",
    )
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    from cbbench.harness.load.cache_options import CacheOptions
    from cbbench.harness.load.options import ClientOptions, LoadOptions, bench_config

    cfg = bench_config(
        args.base_url,
        LoadOptions.from_args(args),
        ClientOptions.from_args(args),
        out_dir=args.out,
        name=args.name,
        live=not args.no_live,
        command=list(sys.argv),
    )
    cfg.cache = CacheOptions.from_args(args)
    return cfg


def run(args: argparse.Namespace) -> int:
    from cbbench.harness.load.rigor import run_rigorous, scenario_queries
    from cbbench.harness.load.rigor_options import RigorOptions
    from cbbench.harness.telemetry import build_samplers

    rigor = RigorOptions.from_args(args)
    if rigor.scenario and args.num_requests is None:  # enough queries, cut at the duration
        args.num_requests = scenario_queries(rigor, args.rate)
    cfg = config_from_args(args)
    if getattr(args, "benchmark_report", None):  # before the run, not after it
        from cbbench.harness.results.formats.export import check_path

        if rigor.repeats > 1:
            from cbbench.harness.errors import CbbenchError

            raise CbbenchError(
                "--benchmark-report exports one run: with --repeats, export each repeat "
                "(cbbench export)"
            )
        check_path(args.benchmark_report)
    telemetry = TelemetryOptions.from_args(args)
    code, run_dir = run_rigorous(cfg, rigor, lambda c: list(build_samplers(telemetry, c.base_url)))
    if getattr(args, "benchmark_report", None):
        from cbbench.harness.results.formats.export import export_benchmark_reports

        for line in export_benchmark_reports(run_dir, args.benchmark_report):
            if line.startswith("warning: "):  # exported anyway: the reader must know
                print(f"cbbench bench: {line}", file=sys.stderr)
            else:
                print(line)
    return code
