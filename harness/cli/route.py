"""`cbbench route`: the router (global scheduler) in front of OpenAI-compatible replicas.

Parse -> RouterOptions (reference_engine/router/options.py) -> serve_router -> the ready line
`cbbench route: ready at URL` (what harness/servers/launcher.py waits for).
"""

from __future__ import annotations

import argparse
import sys

from cbbench.harness.cli.parsing import old_spelling
from cbbench.harness.servers.launcher import ready_line
from cbbench.reference_engine.router.options import add_router_args, router_options_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "route",
        help="route OpenAI requests across engine replicas (a global scheduler)",
        description="Serve an OpenAI-compatible API that sends each request to one of the "
        "replicas (any OpenAI-compatible servers, by URL) by a routing policy; /health says "
        "degraded when a replica is out of rotation; /metrics has per-replica series.",
    )
    p.add_argument(
        "--replica",
        action="append",
        default=None,
        metavar="URL",
        help="a replica's base URL (repeat the flag), e.g. http://10.0.0.2:8000",
    )
    p.add_argument(
        "--prefill",
        nargs="+",
        default=None,
        metavar="URL",
        help="P/D disaggregation: prefill workers (`cbbench serve --role prefill`); each "
        "request goes to one, then to a --decode worker (docs/disaggregation.md)",
    )
    p.add_argument(
        "--decode",
        nargs="+",
        default=None,
        metavar="URL",
        help="P/D disaggregation: decode workers (`cbbench serve --role decode`), picked by "
        "KV headroom",
    )
    add_router_args(p, policy_flag="--router")  # serve --replicas' and sim's name
    old_spelling(p, "--policy", "--router")
    h = p.add_argument_group("HTTP")
    h.add_argument("--host", default="127.0.0.1")
    h.add_argument("--port", type=int, default=8000, help="0 = an ephemeral port")
    h.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    h.add_argument(
        "--replica-api-key", default=None, help="the key sent to the replicas (default --api-key)"
    )
    h.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cbbench.reference_engine.router.serve import serve_router
    from cbbench.reference_engine.server.runner import bind_warning

    warning = bind_warning(args.host, args.api_key)
    if warning:
        print(f"cbbench route: {warning}", file=sys.stderr, flush=True)
    if not args.replica and not args.prefill:
        from cbbench.reference_engine.errors import EngineError

        raise EngineError("cbbench route needs --replica URLs, or --prefill and --decode URLs")
    opts = router_options_from_args(args, args.replica or [])

    def ready(url: str, router) -> None:
        for r in router.pool.replicas:
            state = "in rotation" if r.load.healthy else f"OUT of rotation ({r.down_reason})"
            print(f"cbbench route: {r.name} {r.url} {state}", file=sys.stderr, flush=True)
        print(ready_line("cbbench route", url), flush=True)

    serve_router(opts, ready)
    print("cbbench route: stopped", file=sys.stderr, flush=True)
    return 0
