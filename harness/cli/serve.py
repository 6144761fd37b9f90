"""`cbbench serve`: the reference engine behind an OpenAI-compatible HTTP API.

`add_engine_args(parser)` and `engine_config_from_args(args)` are the one place engine flags
are defined and turned into an EngineConfig; `cbbench run` reuses both. Flags left unset keep
EngineConfig's defaults.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cbbench.reference_engine.errors import EngineError

READY_PREFIX = "cbbench serve: ready at "


def _csv_ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Engine flags: model, device, scheduler and each scheduler's knobs, KV cache."""
    g = parser.add_argument_group("engine")
    g.add_argument(
        "--model",
        default="tiny",
        help="preset name (tiny, small, qwen2.5-0.5b, ...) or an HF model folder (default: tiny)",
    )
    g.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cpu)")
    g.add_argument("--dtype", default=None, help="float32 | float16 | bfloat16 (default: float32)")
    g.add_argument("--scheduler", default="continuous", choices=("static", "dynamic", "continuous"))
    g.add_argument(
        "--executor",
        default=None,
        choices=("real", "sim"),
        help="real torch model, or the cost-model simulator (virtual time)",
    )
    g.add_argument(
        "--hardware",
        default=None,
        help="simulator only: a100, h100, h200, steps, or a calibration JSON (default: h100)",
    )
    g.add_argument("--attention-backend", default=None, choices=("auto", "torch", "triton"))
    g.add_argument("--seed", type=int, default=None)
    s = parser.add_argument_group("static scheduler")
    s.add_argument("--batch-size", type=int, default=None, help="requests per batch")
    s.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        help="seconds before a partial batch is flushed",
    )
    d = parser.add_argument_group("dynamic scheduler")
    d.add_argument("--max-batch-size", type=int, default=None)
    d.add_argument("--preferred-batch-sizes", type=_csv_ints, default=None, help="e.g. 4,8")
    d.add_argument(
        "--max-queue-delay",
        type=float,
        default=None,
        help="seconds the oldest request may wait for a preferred batch",
    )
    c = parser.add_argument_group("continuous scheduler")
    c.add_argument("--max-num-seqs", type=int, default=None)
    c.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="token budget of one step"
    )
    c.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    c.add_argument("--policy", choices=("fcfs", "priority"), default=None)
    c.add_argument(
        "--max-queue-wait",
        type=float,
        default=None,
        help="seconds after which a waiting request is admitted by force",
    )
    c.add_argument("--max-prefills-per-step", type=int, default=None)
    sp = parser.add_argument_group("speculative decoding (continuous scheduler)")
    sp.add_argument(
        "--speculative-method",
        choices=("ngram", "draft"),
        default=None,
        help="propose draft tokens by n-gram prompt lookup or with a draft model (default: off)",
    )
    sp.add_argument(
        "--num-speculative-tokens", type=int, default=None, help="drafts per step (default: 4)"
    )
    sp.add_argument(
        "--speculative-model",
        default=None,
        help="draft model for --speculative-method draft: a preset or HF folder with the "
        "target's vocabulary (the target itself is a 100%%-acceptance control)",
    )
    sp.add_argument("--ngram-min", type=int, default=None, help="shortest suffix looked up (1)")
    sp.add_argument("--ngram-max", type=int, default=None, help="longest suffix looked up (3)")
    sp.add_argument(
        "--spec-acceptance-rate",
        type=float,
        default=None,
        help="simulator only: per-draft-token acceptance probability (default: 0.7)",
    )
    k = parser.add_argument_group("KV cache")
    k.add_argument("--num-kv-blocks", type=int, default=None)
    k.add_argument("--block-size", type=int, default=None, help="tokens per KV block")
    k.add_argument("--kv-cache-memory-gb", type=float, default=None)
    k.add_argument("--enable-prefix-caching", action="store_true", default=None)
    k.add_argument("--max-model-len", type=int, default=None)
    k.add_argument(
        "--max-waiting",
        type=int,
        default=None,
        help="waiting-queue limit; beyond it requests get HTTP 429",
    )


# flag dest -> (sub-config or None, EngineConfig field)
_FIELDS: dict[str, tuple[str | None, str]] = {
    "model": (None, "model"),
    "device": (None, "device"),
    "dtype": (None, "dtype"),
    "scheduler": (None, "scheduler"),
    "executor": (None, "executor"),
    "seed": (None, "seed"),
    "hardware": (None, "hardware"),
    "attention_backend": (None, "attention_backend"),
    "num_kv_blocks": (None, "num_kv_blocks"),
    "block_size": (None, "block_size"),
    "kv_cache_memory_gb": (None, "kv_cache_memory_gb"),
    "enable_prefix_caching": (None, "enable_prefix_caching"),
    "max_model_len": (None, "max_model_len"),
    "max_waiting": (None, "max_waiting"),
    "batch_size": ("static", "batch_size"),
    "drain_timeout": ("static", "drain_timeout_s"),
    "max_batch_size": ("dynamic", "max_batch_size"),
    "preferred_batch_sizes": ("dynamic", "preferred_batch_sizes"),
    "max_queue_delay": ("dynamic", "max_queue_delay_s"),
    "max_num_seqs": ("continuous", "max_num_seqs"),
    "max_num_batched_tokens": ("continuous", "max_num_batched_tokens"),
    "enable_chunked_prefill": ("continuous", "enable_chunked_prefill"),
    "policy": ("continuous", "policy"),
    "max_queue_wait": ("continuous", "max_queue_wait_s"),
    "max_prefills_per_step": ("continuous", "max_prefills_per_step"),
    "speculative_method": ("speculative", "method"),
    "num_speculative_tokens": ("speculative", "num_speculative_tokens"),
    "speculative_model": ("speculative", "model"),
    "ngram_min": ("speculative", "ngram_min"),
    "ngram_max": ("speculative", "ngram_max"),
    "spec_acceptance_rate": ("speculative", "acceptance_rate"),
}


def engine_config_from_args(args: argparse.Namespace) -> Any:
    """The EngineConfig the flags describe (EngineError on bad values)."""
    from cbbench.reference_engine.config import (
        ContinuousConfig,
        DynamicConfig,
        EngineConfig,
        SpeculativeConfig,
        StaticConfig,
    )

    top: dict[str, Any] = {}
    subs: dict[str, dict[str, Any]] = {
        "static": {},
        "dynamic": {},
        "continuous": {},
        "speculative": {},
    }
    for dest, (sub, name) in _FIELDS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        (top if sub is None else subs[sub])[name] = value
    return EngineConfig(
        **top,
        static=StaticConfig(**subs["static"]),
        dynamic=DynamicConfig(**subs["dynamic"]),
        continuous=ContinuousConfig(**subs["continuous"]),
        speculative=SpeculativeConfig(**subs["speculative"]),
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the reference engine over an OpenAI-compatible HTTP API",
        description="Serve the reference engine: /v1/completions, /v1/chat/completions, "
        "/v1/models, /health, /metrics (Prometheus, vLLM names).",
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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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
    warning = bind_warning(args.host, args.api_key)
    if warning:
        print(f"cbbench serve: {warning}", file=sys.stderr, flush=True)
    config = engine_config_from_args(args)
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
        )
    except BaseException:
        sock.close()
        raise
    url = base_url(sock)

    info = stack.engine_info
    print(
        f"cbbench serve: {stack.model_name} ({info['num_params'] / 1e6:.1f}M params, "
        f"{info['dtype']}, {info['device']}), scheduler {info['scheduler']}, executor "
        f"{info['executor']}, attention backend {info['attention_backend'] or 'none'}, "
        f"{info['num_kv_blocks']} KV blocks x {info['block_size']} tokens, engine in "
        f"{'its own process' if info['engine_process'] else 'the API process'}",
        file=sys.stderr,
        flush=True,
    )

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
    return 0
