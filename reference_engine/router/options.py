"""The router's settings: `RouterOptions`, and their flags, declared once for `cbbench route`
and `cbbench serve --replicas` (`add_router_args`, `router_options_from_args`).

Light to import (no httpx, no FastAPI): `--help` stays fast.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.router.registry import POLICY_NAMES

POLL_INTERVAL_S = 0.5
UPSTREAM_TIMEOUT_S = 600.0
SESSION_HEADER = "x-session-id"


@dataclass
class RouterOptions:
    replicas: Sequence[str]  # base URLs
    policy: str = "least-outstanding"
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # clients must send it
    replica_api_key: str | None = None  # sent to the replicas (default: api_key)
    poll_interval_s: float = POLL_INTERVAL_S
    upstream_timeout_s: float = UPSTREAM_TIMEOUT_S
    log_level: str = "warning"
    session_header: str = SESSION_HEADER  # session-affinity: the header naming the session

    def validate(self) -> None:
        if not 0 <= self.port <= 65535:
            raise EngineError(f"--port must be in [0, 65535], got {self.port}")
        if not self.poll_interval_s > 0:
            raise EngineError(f"--poll-interval must be > 0 s, got {self.poll_interval_s}")
        if not self.upstream_timeout_s > 0:
            raise EngineError(f"--upstream-timeout must be > 0 s, got {self.upstream_timeout_s}")


def add_router_args(p: argparse.ArgumentParser, policy_flag: str = "--policy") -> None:
    """The router's flags (`cbbench route --policy`, `cbbench serve --replicas N --router`)."""
    g = p.add_argument_group("router")
    g.add_argument(
        policy_flag,
        dest="router_policy",
        default="least-outstanding",
        choices=POLICY_NAMES,
        help="how a request picks its replica (default least-outstanding; docs/router.md)",
    )
    g.add_argument(
        "--session-header",
        default=SESSION_HEADER,
        metavar="NAME",
        help=f"session-affinity: the request header naming a session (default {SESSION_HEADER})",
    )
    g.add_argument(
        "--poll-interval",
        type=float,
        default=POLL_INTERVAL_S,
        metavar="S",
        help=f"read each replica's /health and /metrics every S seconds (default {POLL_INTERVAL_S})",
    )
    g.add_argument(
        "--upstream-timeout",
        type=float,
        default=UPSTREAM_TIMEOUT_S,
        metavar="S",
        help=f"give up on a replica that sends nothing for S seconds: 504 (default {UPSTREAM_TIMEOUT_S:g})",
    )


def router_options_from_args(args: argparse.Namespace, replicas: Sequence[str]) -> RouterOptions:
    """The options `add_router_args` (and the command's --host/--port/--api-key) describe."""
    opts = RouterOptions(
        replicas=list(replicas),
        policy=args.router_policy,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        replica_api_key=getattr(args, "replica_api_key", None),
        poll_interval_s=args.poll_interval,
        upstream_timeout_s=args.upstream_timeout,
        log_level=args.log_level,
        session_header=getattr(args, "session_header", SESSION_HEADER),
    )
    opts.validate()
    return opts
