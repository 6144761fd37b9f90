"""Serving an app on uvicorn: in the foreground (`cbbench serve`) or in a thread (tests).

Both bind the socket themselves (port 0 = an ephemeral port) so the real port is known
before the first request. On SIGINT/SIGTERM the engine is told to shut down *first*, so
every in-flight stream ends with an error event and uvicorn's graceful wait never hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import ipaddress
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import uvicorn
from starlette.types import ASGIApp

# Backstop: connections still open this long after a shutdown signal are cancelled.
GRACEFUL_SHUTDOWN_S = 5


def bind_warning(host: str, api_key: str | None) -> str | None:
    """A warning when `host` is reachable from other machines and no API key guards /v1."""
    if api_key:
        return None
    if host.lower() == "localhost":
        return None
    try:
        if ipaddress.ip_address(host.strip("[]")).is_loopback:
            return None
    except ValueError:
        pass  # a host name: it may resolve to anything
    return (
        f"warning: --host {host} accepts connections from other machines and no --api-key "
        "is set: anyone who can reach this port can use the model"
    )


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets that say TCP, and
    # without it Nagle holds each SSE chunk until the previous one is ACKed (~40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def base_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


async def warm_anyio() -> None:
    """Starlette's StreamingResponse opens an anyio task group, and anyio imports its asyncio
    backend at the first one (~30 ms on the 2-core host). Done here, before the socket
    accepts, not inside the first stream: there the engine's first tokens queued behind the
    import and reached the client in one burst (TTFT 41 ms, then 16 tokens within 1.3 ms)."""
    import anyio

    async with anyio.create_task_group():
        pass


class Server(uvicorn.Server):
    """uvicorn.Server with a ready callback and an on-signal hook; a signal ends `serve()`
    normally (uvicorn re-raises it otherwise)."""

    def __init__(
        self,
        config: uvicorn.Config,
        on_ready: Callable[[], None] | None = None,
        on_stop: Callable[[], None] | None = None,
    ):
        super().__init__(config)
        self.on_ready = on_ready
        self.on_stop = on_stop

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await warm_anyio()
        await super().startup(sockets)
        if self.started and self.on_ready is not None:
            self.on_ready()

    def stop(self) -> None:
        if self.on_stop is not None:
            self.on_stop()
        self.should_exit = True

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handle(sig: int, frame: object) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.stop()

        sigs = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, handle) for sig in sigs}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# The API process's event loop and HTTP parser: uvloop and httptools when installed (the `fast`
# extra; the tests install both), else asyncio and h11. Under a full batch on 2 cores they cut the
# /v1/models p99 from 12.8-16.1 ms to 8.8 ms (docs/performance.md).
LOOP_IMPL = "uvloop" if _have("uvloop") else "asyncio"
HTTP_IMPL = "httptools" if _have("httptools") else "h11"


def make_server(
    app: ASGIApp,
    on_ready: Callable[[], None] | None = None,
    on_stop: Callable[[], None] | None = None,
    log_level: str = "warning",
) -> Server:
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        http=HTTP_IMPL,
        loop=LOOP_IMPL,
    )
    return Server(config, on_ready, on_stop)


@dataclass
class ThreadedServer:
    """`with ThreadedServer(app, on_stop=engine.shutdown) as url:` serves on 127.0.0.1:0 in
    a background thread until the block ends."""

    app: ASGIApp
    on_stop: Callable[[], None] | None = None
    host: str = "127.0.0.1"
    ready_timeout_s: float = 30.0

    def __enter__(self) -> str:
        self._sock = bind_socket(self.host, 0)
        ready = threading.Event()
        self._server = make_server(self.app, on_ready=ready.set, on_stop=self.on_stop)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve(sockets=[self._sock])),
            name="cbbench-uvicorn",
            daemon=True,
        )
        self._thread.start()
        if not ready.wait(self.ready_timeout_s):
            self.__exit__(None, None, None)
            raise RuntimeError("server thread did not start")
        return base_url(self._sock)

    @property
    def server(self) -> Server:
        return self._server

    def __exit__(self, *exc: object) -> None:
        self._server.stop()
        self._thread.join(GRACEFUL_SHUTDOWN_S + 5)
        self._sock.close()
