"""The scripted OpenAI-compatible server (`cbbench.harness.fake_server`) for tests: in a thread
(`threaded`) or in its own process (`process`, which a test may kill mid-run).

The server's behaviour per request index is a `Behavior` (TTFT, gap per chunk, tokens per
chunk, HTTP status, reset after N tokens, hang, short output); see the module for details.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

from cbbench.harness.fake_server import Behavior, FakeServerConfig, ThreadedServer

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
    cfg = (config or FakeServerConfig()).to_json()
    cmd = [sys.executable, "-m", "cbbench.harness.fake_server", "--config", cfg]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("PORT "), f"fake server did not start: {line!r}"
        server = ServerProc(proc, int(line.split()[1]))
        yield server
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
