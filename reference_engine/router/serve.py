"""Running the router: `serve_router(RouterOptions, on_ready)` in the foreground (`cbbench
route`, `cbbench serve --replicas`), `RouterThread` in a background thread (tests).

The pool's first poll happens before the socket accepts requests, so a replica that is
down at start begins out of rotation; none reachable is an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable

from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.router.app import Router, create_router_app
from cbbench.reference_engine.router.options import RouterOptions
from cbbench.reference_engine.router.pd import PDPools
from cbbench.reference_engine.router.registry import make_policy
from cbbench.reference_engine.router.upstream import ReplicaPool
from cbbench.reference_engine.server.runner import (
    GRACEFUL_SHUTDOWN_S,
    LOOP_IMPL,
    base_url,
    bind_socket,
    make_server,
)


def build_router(opts: RouterOptions) -> tuple[Router, object]:
    opts.validate()
    key = opts.replica_api_key if opts.replica_api_key is not None else opts.api_key
    urls, names = list(opts.replicas), None
    if opts.prefill:  # P/D: one pool, prefill workers first (router/pd.py)
        urls = [*opts.prefill, *opts.decode]
        names = [f"p{i}" for i in range(len(opts.prefill))]
        names += [f"d{i}" for i in range(len(opts.decode))]
    pool = ReplicaPool(
        urls, key, opts.poll_interval_s, opts.breaker(), opts.upstream_timeout_s, names
    )
    router = Router(
        pool, make_policy(opts.policy), opts.upstream_timeout_s, opts.retries,
        session_header=opts.session_header,
    )
    if opts.prefill:
        n = len(opts.prefill)
        router.pd = PDPools(frozenset(range(n)), frozenset(range(n, len(urls))))
    return router, create_router_app(router, api_key=opts.api_key)


async def _serve(
    opts: RouterOptions,
    sock: socket.socket,
    on_ready: Callable[[str, Router], None],
    started: Callable[[object], None] | None = None,
) -> None:
    router, app = build_router(opts)
    await router.pool.start()
    try:
        if not router.pool.healthy:
            why = "; ".join(f"{r.url}: {r.down_reason}" for r in router.pool.replicas)
            raise EngineError(f"no replica is reachable ({why})")
        server = make_server(
            app, on_ready=lambda: on_ready(base_url(sock), router), log_level=opts.log_level
        )
        if started is not None:
            started(server)
        await server.serve(sockets=[sock])
    finally:
        await router.pool.stop()
        await router.aclose()


def _runner() -> asyncio.Runner:
    if LOOP_IMPL == "uvloop":
        import uvloop

        return asyncio.Runner(loop_factory=uvloop.new_event_loop)
    return asyncio.Runner()


def serve_router(opts: RouterOptions, on_ready: Callable[[str, Router], None]) -> None:
    """Bind, poll the replicas, serve until SIGINT/SIGTERM; `on_ready(url, router)` once
    the socket accepts requests."""
    opts.validate()
    try:
        sock = bind_socket(opts.host, opts.port)
    except OSError as exc:
        raise EngineError(f"cannot bind {opts.host}:{opts.port}: {exc.strerror}") from None
    try:
        with _runner() as runner:
            runner.run(_serve(opts, sock, on_ready))
    finally:
        sock.close()


class RouterThread:
    """`with RouterThread(RouterOptions([url1, url2], port=0)) as url:` serves the router on
    127.0.0.1 in a background thread until the block ends; `.router` is its state."""

    def __init__(self, opts: RouterOptions, ready_timeout_s: float = 30.0) -> None:
        self.opts, self.ready_timeout_s = opts, ready_timeout_s
        self.router: Router | None = None
        self._server = None
        self._error: BaseException | None = None

    def __enter__(self) -> str:
        self._sock = bind_socket(self.opts.host, self.opts.port)
        ready = threading.Event()

        def on_ready(url: str, router: Router) -> None:
            self.router = router
            ready.set()

        def started(server: object) -> None:
            self._server = server

        def run() -> None:
            try:
                asyncio.run(_serve(self.opts, self._sock, on_ready, started))
            except BaseException as exc:  # handed to __enter__
                self._error = exc
            finally:
                ready.set()

        self._thread = threading.Thread(target=run, name="cbbench-router", daemon=True)
        self._thread.start()
        ready.wait(self.ready_timeout_s)
        if self.router is None:
            self.__exit__()
            raise self._error or RuntimeError("router thread did not start")
        return base_url(self._sock)

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.stop()  # type: ignore[attr-defined]
        self._thread.join(GRACEFUL_SHUTDOWN_S + 5)
        with contextlib.suppress(OSError):
            self._sock.close()
