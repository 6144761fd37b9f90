"""The router's settings: `RouterOptions`, and their flags, declared once for `cbbench route`
and `cbbench serve --replicas` (`add_router_args`, `router_options_from_args`).

Light to import (no httpx, no FastAPI): `--help` stays fast.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from cbbench.reference_engine.config.options import seconds_arg
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.router.breaker import BreakerSettings
from cbbench.reference_engine.router.registry import POLICY_NAMES

POLL_INTERVAL_S = 0.5
UPSTREAM_TIMEOUT_S = 600.0
# the circuit breaker's and the retry's defaults (router/breaker.py; docs/router.md)
BREAKER_FAILURES = 3
BREAKER_ERROR_RATE = 0.5
BREAKER_WINDOW = 20
BREAKER_COOLDOWN_S = 5.0
RETRIES = 1
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
    breaker_failures: int = BREAKER_FAILURES
    breaker_error_rate: float = BREAKER_ERROR_RATE
    breaker_window: int = BREAKER_WINDOW
    breaker_cooldown_s: float = BREAKER_COOLDOWN_S
    retries: int = RETRIES  # before the first byte reached the client, on another replica
    # prefill/decode disaggregation (router/pd.py): two pools instead of `replicas`
    prefill: Sequence[str] = ()
    decode: Sequence[str] = ()

    def breaker(self) -> BreakerSettings:
        return BreakerSettings(
            self.breaker_failures,
            self.breaker_error_rate,
            self.breaker_window,
            self.breaker_cooldown_s,
        )

    session_header: str = SESSION_HEADER  # session-affinity: the header naming the session

    def validate(self) -> None:
        if bool(self.prefill) != bool(self.decode):
            raise EngineError("P/D routing needs both --prefill and --decode URLs")
        if self.prefill and self.replicas:
            raise EngineError("give either --replica URLs or --prefill/--decode pools, not both")
        if not 0 <= self.port <= 65535:
            raise EngineError(f"--port must be in [0, 65535], got {self.port}")
        if not self.poll_interval_s > 0:
            raise EngineError(f"--poll-interval must be > 0 s, got {self.poll_interval_s}")
        if not self.upstream_timeout_s > 0:
            raise EngineError(f"--upstream-timeout must be > 0 s, got {self.upstream_timeout_s}")
        if self.breaker_failures < 0:
            raise EngineError(f"--breaker-failures must be >= 0, got {self.breaker_failures}")
        if not 0 <= self.breaker_error_rate <= 1:
            raise EngineError(
                f"--breaker-error-rate must be in [0, 1], got {self.breaker_error_rate}"
            )
        if self.breaker_window < 1:
            raise EngineError(f"--breaker-window must be >= 1, got {self.breaker_window}")
        if not self.breaker_cooldown_s > 0:
            raise EngineError(f"--breaker-cooldown must be > 0 s, got {self.breaker_cooldown_s}")
        if not 0 <= self.retries <= 1:
            raise EngineError(f"--retries must be 0 or 1, got {self.retries}")


def add_router_args(p: argparse.ArgumentParser, policy_flag: str = "--router") -> None:
    """The router's flags (`cbbench route --router`, `cbbench serve --replicas N --router`; the
    old `route --policy` is registered by the command)."""
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
        type=seconds_arg,
        default=POLL_INTERVAL_S,
        metavar="DURATION",
        help="read each replica's /health and /metrics this often (250ms, 1s; a bare number is "
        f"seconds; default {POLL_INTERVAL_S:g}s)",
    )
    g.add_argument(
        "--upstream-timeout",
        type=seconds_arg,
        default=UPSTREAM_TIMEOUT_S,
        metavar="DURATION",
        help="give up on a replica that sends nothing this long: 504 (a bare number is seconds; "
        f"default {UPSTREAM_TIMEOUT_S:g}s)",
    )
    b = p.add_argument_group("circuit breaker and retry (docs/router.md)")
    b.add_argument(
        "--breaker-failures",
        type=int,
        default=BREAKER_FAILURES,
        metavar="N",
        help="take a replica out after N failed answers in a row: refused, lost, timed out, "
        f"5xx, junk (0 = off; default {BREAKER_FAILURES})",
    )
    b.add_argument(
        "--breaker-error-rate",
        type=float,
        default=BREAKER_ERROR_RATE,
        metavar="F",
        help="... or when a fraction F of its last --breaker-window answers failed "
        f"(0 = off; default {BREAKER_ERROR_RATE})",
    )
    b.add_argument(
        "--breaker-window",
        type=int,
        default=BREAKER_WINDOW,
        metavar="N",
        help=f"answers the error rate is taken over (default {BREAKER_WINDOW})",
    )
    b.add_argument(
        "--breaker-cooldown",
        type=seconds_arg,
        default=BREAKER_COOLDOWN_S,
        metavar="DURATION",
        help="probe a replica taken out after this long; back in rotation on a good answer "
        f"(doubled after each failed probe, up to 8x; default {BREAKER_COOLDOWN_S:g}s)",
    )
    b.add_argument(
        "--retries",
        type=int,
        default=RETRIES,
        choices=(0, 1),
        help="resend a request that failed before its first byte reached the client "
        f"(refused, 5xx, junk, timed out) to another replica (default {RETRIES})",
    )


def router_options_from_args(args: argparse.Namespace, replicas: Sequence[str]) -> RouterOptions:
    """The options `add_router_args` (and the command's --host/--port/--api-key) describe."""
    opts = RouterOptions(
        replicas=list(replicas),
        prefill=list(getattr(args, "prefill", None) or ()),
        decode=list(getattr(args, "decode", None) or ()),
        policy=args.router_policy,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        replica_api_key=getattr(args, "replica_api_key", None),
        poll_interval_s=args.poll_interval,
        upstream_timeout_s=args.upstream_timeout,
        log_level=args.log_level,
        breaker_failures=args.breaker_failures,
        breaker_error_rate=args.breaker_error_rate,
        breaker_window=args.breaker_window,
        breaker_cooldown_s=args.breaker_cooldown,
        retries=args.retries,
        session_header=getattr(args, "session_header", SESSION_HEADER),
    )
    opts.validate()
    return opts
