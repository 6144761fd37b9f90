"""`cbbench serve`: the reference engine behind an OpenAI-compatible HTTP API.

Engine flags come from reference_engine/config/options.py (the one registry every command shares);
flags left unset keep EngineConfig's defaults. The ready line (`READY_PREFIX` + URL on stdout)
is what harness/servers/launcher.py waits for.
"""

from __future__ import annotations

import argparse
import sys

from cbbench.harness.servers.launcher import READY_PREFIX
from cbbench.reference_engine.config.options import (
    add_engine_args,
    engine_config_from_args,
    engine_settings,
    inapplicable,
)
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.router.options import add_router_args, router_options_from_args
from cbbench.reference_engine.server.quick_exit import exit_now
from cbbench.reference_engine.server.reasoning import ReasoningOptions

__all__ = ["READY_PREFIX", "add_engine_args", "engine_config_from_args", "register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the reference engine over an OpenAI-compatible HTTP API",
        description="Serve the reference engine over HTTP: POST /v1/completions, "
        "/v1/chat/completions, /v1/responses, /v1/messages (Anthropic), /v1/embeddings, "
        "/tokenize, /reset_prefix_cache (vLLM's name; SGLang's /flush_cache); GET /v1/models, "
        "/health, /metrics (Prometheus, vLLM names). docs/serving.md",
    )
    add_engine_args(p)
    h = p.add_argument_group("HTTP")
    h.add_argument("--host", default="127.0.0.1")
    h.add_argument("--port", type=int, default=8000, help="0 = an ephemeral port")
    h.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    h.add_argument(
        "--served-model-name", default=None, help="the model name clients use (default: --model)"
    )
    h.add_argument(
        "--max-body-bytes",
        type=int,
        default=None,
        help="request body limit (413 beyond; default 4 MiB)",
    )
    h.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    h.add_argument(
        "--engine-process",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the engine in its own process, the HTTP API in this one (default: on; "
        "--no-engine-process runs it in a thread of the API process)",
    )
    h.add_argument(
        "--engine-nice",
        type=int,
        default=0,
        help="lower the engine process's CPU priority by N (0-19; os.nice) so the HTTP API "
        "goes first on a contended core (default 0)",
    )
    h.add_argument(
        "--api-rt-priority",
        type=int,
        default=0,
        help="run the HTTP API process's threads under SCHED_RR at this priority (1-99; "
        "needs root or CAP_SYS_NICE) so a request preempts the engine on a busy core; "
        "the engine keeps the normal class (default 0: off)",
    )
    r = p.add_argument_group("replicas (docs/router.md)")
    r.add_argument(
        "--replicas",
        type=int,
        default=None,
        metavar="N",
        help="start N engine servers (each its own process on an ephemeral 127.0.0.1 port) "
        "and a router in front of them on --host/--port",
    )
    r.add_argument(
        "--prefill-replicas",
        type=int,
        default=None,
        metavar="P",
        help="P/D disaggregation: start P `--role prefill` and --decode-replicas D `--role "
        "decode` servers and the P/D router in front (docs/disaggregation.md)",
    )
    r.add_argument(
        "--decode-replicas",
        type=int,
        default=None,
        metavar="D",
        help="P/D disaggregation: the number of decode workers (with --prefill-replicas)",
    )
    ReasoningOptions.add_args(p)
    add_router_args(p, policy_flag="--router")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.replicas is not None or args.prefill_replicas or args.decode_replicas:
        return _run_replicas(args)
    from cbbench.reference_engine.server.app import DEFAULT_MAX_BODY_BYTES
    from cbbench.reference_engine.server.build import build_stack
    from cbbench.reference_engine.server.runner import (
        base_url,
        bind_socket,
        bind_warning,
        make_server,
    )

    if not 0 <= args.port <= 65535:
        raise EngineError(f"--port must be in [0, 65535], got {args.port}")
    max_body = args.max_body_bytes or DEFAULT_MAX_BODY_BYTES
    if max_body < 1:
        raise EngineError(f"--max-body-bytes must be >= 1, got {max_body}")
    if not 0 <= args.engine_nice <= 19:
        raise EngineError(f"--engine-nice must be in [0, 19], got {args.engine_nice}")
    if not 0 <= args.api_rt_priority <= 99:
        raise EngineError(f"--api-rt-priority must be in [0, 99], got {args.api_rt_priority}")
    if args.api_rt_priority and not args.engine_process:
        raise EngineError(
            "--api-rt-priority needs --engine-process (the engine thread would run RT)"
        )
    warning = bind_warning(args.host, args.api_key)
    if warning:
        print(f"cbbench serve: {warning}", file=sys.stderr, flush=True)
    config = engine_config_from_args(args)
    for line in inapplicable(engine_settings(args), [config.scheduler]):
        print(f"cbbench serve: warning: {line}", file=sys.stderr, flush=True)
    reasoning = ReasoningOptions.from_args(args)
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        raise EngineError(f"cannot bind {args.host}:{args.port}: {exc.strerror}") from None
    try:
        stack = build_stack(
            config,
            served_model_name=args.served_model_name,
            api_key=args.api_key,
            max_body_bytes=max_body,
            engine_process=args.engine_process,
            engine_nice=args.engine_nice,
            reasoning=reasoning,
        )
    except BaseException:
        sock.close()
        raise
    url = base_url(sock)
    if args.api_rt_priority:  # after the engine process started: it keeps the normal class
        from cbbench.reference_engine.server.cpu_priority import raise_to_realtime

        why = raise_to_realtime(args.api_rt_priority)
        if why:
            print(f"cbbench serve: --api-rt-priority ignored: {why}", file=sys.stderr, flush=True)

    info = stack.engine_info
    if info["executor"] == "sim":  # no weights, no device: step times from the cost model
        what = (
            f"SIMULATED, no weights loaded: {info['num_params'] / 1e6:.1f}M-parameter shape, "
            f"step times from the cost model of {config.hardware}"
        )
    else:
        what = f"{info['num_params'] / 1e6:.1f}M params, {info['dtype']}, {info['device']}"
    print(
        f"cbbench serve: {stack.model_name} ({what}), scheduler {info['scheduler']}, executor "
        f"{info['executor']}, attention backend {info['attention_backend'] or 'none'}, "
        f"{info['num_kv_blocks']} KV blocks x {info['block_size']} tokens, engine in "
        f"{'its own process' if info['engine_process'] else 'the API process'}, chat template "
        f"{info.get('chat_template', 'built-in')}",
        file=sys.stderr,
        flush=True,
    )
    if info.get("hugepages"):  # the CPU engine's weights and KV cache (CBBENCH_HUGEPAGES)
        print(f"cbbench serve: huge pages: {info['hugepages']}", file=sys.stderr, flush=True)

    def ready() -> None:
        print(f"{READY_PREFIX}{url}", flush=True)

    server = make_server(
        stack.app, on_ready=ready, on_stop=stack.stop_soon, log_level=args.log_level
    )
    try:
        server.run(sockets=[sock])
    finally:
        stack.shutdown()
        sock.close()
    print("cbbench serve: stopped", file=sys.stderr, flush=True)
    exit_now(0)  # everything is closed: ~0.05 s instead of Python's ~1 s teardown of torch


def _replica_argv(args: argparse.Namespace) -> list[str]:
    """The flags each replica child gets: the engine's and the HTTP ones, not host/port."""
    from cbbench.reference_engine.config.options import engine_argv, engine_settings

    argv = engine_argv(engine_settings(args))
    for flag, value in (
        ("--api-key", args.api_key),
        ("--served-model-name", args.served_model_name),
        ("--max-body-bytes", args.max_body_bytes),
        ("--engine-nice", args.engine_nice or None),
        ("--api-rt-priority", args.api_rt_priority or None),
    ):
        if value is not None:
            argv += [flag, str(value)]
    argv += ReasoningOptions.from_args(args).argv()
    argv += ["--log-level", args.log_level]
    return argv + ([] if args.engine_process else ["--no-engine-process"])


def _run_replicas(args: argparse.Namespace) -> int:
    from cbbench.harness.studies.replicas import ReplicaSetOptions, serve_replicas
    from cbbench.reference_engine.server.runner import bind_warning

    config = engine_config_from_args(args)  # bad engine flags: one error here, not N children's
    for line in inapplicable(engine_settings(args), [config.scheduler]):
        print(f"cbbench serve: warning: {line}", file=sys.stderr, flush=True)
    warning = bind_warning(args.host, args.api_key)
    if warning:
        print(f"cbbench serve: {warning}", file=sys.stderr, flush=True)
    opts = ReplicaSetOptions(
        args.replicas or 0,
        _replica_argv(args),
        router_options_from_args(args, []),
        num_prefill=args.prefill_replicas or 0,
        num_decode=args.decode_replicas or 0,
    )
    opts.validate()
    names = [name for name, _ in opts.children()]

    def replica(i: int, handle) -> None:
        print(
            f"cbbench serve: replica {names[i]} (pid {handle.process.pid}) at {handle.base_url}",
            file=sys.stderr,
            flush=True,
        )

    def ready(url: str, router) -> None:
        print(
            f"cbbench serve: router ({router.policy.name}) over {len(names)} replicas"
            + (f" ({opts.num_prefill} prefill, {opts.num_decode} decode)" if opts.num_prefill else ""),
            file=sys.stderr,
            flush=True,
        )
        print(f"{READY_PREFIX}{url}", flush=True)

    serve_replicas(opts, replica, ready)
    print("cbbench serve: stopped", file=sys.stderr, flush=True)
    return 0
