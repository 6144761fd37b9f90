"""`cbbench serve --replicas N --router POLICY`: N reference-engine servers, each a `cbbench
serve` child on an ephemeral 127.0.0.1 port (started and waited for by the one launcher),
and the router in front of them in this process, which prints `cbbench serve`'s ready line.

A replica that dies stays dead: the router takes it out of rotation (its in-flight requests
fail with an OpenAI error body), the others keep serving, /health says degraded.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cbbench.harness.errors import CbbenchError
from cbbench.harness.servers.launcher import ServerHandle, start_server
from cbbench.reference_engine.router.options import RouterOptions

MAX_REPLICAS = 64


@dataclass
class ReplicaSetOptions:
    num_replicas: int
    replica_argv: Sequence[str]  # `cbbench serve` flags of each replica (not --host/--port)
    router: RouterOptions  # its `replicas` are filled in with the children's URLs
    ready_timeout_s: float = 180.0

    def validate(self) -> None:
        if not 1 <= self.num_replicas <= MAX_REPLICAS:
            raise CbbenchError(
                f"--replicas must be in [1, {MAX_REPLICAS}], got {self.num_replicas}"
            )


def replica_command(argv: Sequence[str]) -> list[str]:
    return [
        sys.executable, "-m", "cbbench.harness.cli", "serve", *argv,
        "--host", "127.0.0.1", "--port", "0",
    ]  # fmt: skip


def start_replicas(opts: ReplicaSetOptions) -> list[ServerHandle]:
    """Start every replica at once and wait for all; on any failure stop the others."""
    handles: list[ServerHandle | None] = [None] * opts.num_replicas
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            handles[i] = start_server(
                replica_command(opts.replica_argv), opts.ready_timeout_s, name=f"replica r{i}"
            )
        except BaseException as exc:  # reported below, after every thread ended
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(opts.num_replicas)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    started = [h for h in handles if h is not None]
    if errors:
        for h in started:
            h.stop()
        raise errors[0]
    return started


def serve_replicas(
    opts: ReplicaSetOptions,
    on_replica: Callable[[int, ServerHandle], None],
    on_ready: Callable[[str, object], None],
) -> None:
    """Start the replicas, then serve the router until SIGINT/SIGTERM; stop them after."""
    from cbbench.reference_engine.router.serve import serve_router

    opts.validate()
    opts.router.validate()
    handles = start_replicas(opts)
    try:
        for i, h in enumerate(handles):
            on_replica(i, h)
        opts.router.replicas = [h.base_url for h in handles]
        serve_router(opts.router, on_ready)
    finally:
        for h in handles:
            h.stop()
