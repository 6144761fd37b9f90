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
    # P/D disaggregation: this many `--role prefill` and `--role decode` children instead
    # (num_replicas 0), the router's P/D dispatch in front (router/pd.py)
    num_prefill: int = 0
    num_decode: int = 0

    def children(self) -> list[tuple[str, list[str]]]:
        """(name, `cbbench serve` flags) of each child."""
        if not self.num_prefill:
            return [(f"r{i}", list(self.replica_argv)) for i in range(self.num_replicas)]
        return [(f"p{i}", [*self.replica_argv, "--role", "prefill"])
                for i in range(self.num_prefill)] + [
                (f"d{i}", [*self.replica_argv, "--role", "decode"])
                for i in range(self.num_decode)]  # fmt: skip

    def validate(self) -> None:
        if bool(self.num_prefill) != bool(self.num_decode):
            raise CbbenchError("--prefill-replicas and --decode-replicas go together")
        if self.num_prefill and self.num_replicas:
            raise CbbenchError("give --replicas N, or --prefill-replicas P --decode-replicas D")
        n = self.num_prefill + self.num_decode if self.num_prefill else self.num_replicas
        if not 1 <= n <= MAX_REPLICAS:
            raise CbbenchError(f"--replicas must be in [1, {MAX_REPLICAS}], got {n}")


def replica_command(argv: Sequence[str]) -> list[str]:
    return [
        sys.executable, "-m", "cbbench.harness.cli", "serve", *argv,
        "--host", "127.0.0.1", "--port", "0",
    ]  # fmt: skip


def start_replicas(opts: ReplicaSetOptions) -> list[ServerHandle]:
    """Start every replica at once and wait for all; on any failure stop the others."""
    children = opts.children()
    handles: list[ServerHandle | None] = [None] * len(children)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        name, argv = children[i]
        try:
            handles[i] = start_server(
                replica_command(argv), opts.ready_timeout_s, name=f"replica {name}"
            )
        except BaseException as exc:  # reported below, after every thread ended
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(children))]
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
    handles = start_replicas(opts)
    try:
        for i, h in enumerate(handles):
            on_replica(i, h)
        urls = [h.base_url for h in handles]
        if opts.num_prefill:
            opts.router.prefill, opts.router.decode = (
                urls[: opts.num_prefill],
                urls[opts.num_prefill :],
            )
        else:
            opts.router.replicas = urls
        serve_router(opts.router, on_ready)
    finally:
        for h in handles:
            h.stop()
