"""The scripted OpenAI-compatible server (`cbbench.harness.servers.fake_server`) for tests: in a thread
(`threaded`) or in its own process (`process`, which a test may kill mid-run).

The server's behaviour per request index is a `Behavior` (TTFT, gap per chunk, tokens per
chunk, HTTP status, reset after N tokens, hang, short output); see the module for details.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator

from cbbench.harness.servers.fake_server import Behavior, FakeServerConfig, ThreadedServer

__all__ = ["Behavior", "FakeServerConfig", "process", "threaded"]


@contextlib.contextmanager
def threaded(config: FakeServerConfig | None = None) -> Iterator[ThreadedServer]:
    server = ThreadedServer(config)
    try:
        yield server
    finally:
        server.stop()


class ServerProc:
    def __init__(self, proc: subprocess.Popen, port: int) -> None:
        self.proc = proc
        self.url = f"http://127.0.0.1:{port}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@contextlib.contextmanager
def process(config: FakeServerConfig | None = None) -> Iterator[ServerProc]:
    from cbbench.harness.servers.launcher import fake_server_command, start_server

    handle = start_server(fake_server_command((config or FakeServerConfig()).to_json()))
    try:
        yield ServerProc(handle.process, int(handle.base_url.rsplit(":", 1)[1]))
    finally:
        if handle.process.poll() is None:
            handle.process.kill()
        handle.process.wait(10)
