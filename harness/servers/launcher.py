"""Start a server as a subprocess and talk to it over HTTP only: the one launcher.

    with launch_reference_server(model="tiny", scheduler="continuous") as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")
    with launch_server([sys.executable, "-m", "cbbench.harness.servers.fake_server"]) as server: ...

One readiness signal for every server cbbench starts: the child prints one line
`NAME: ready at http://127.0.0.1:PORT` (`ready_line`) on stdout once it accepts connections
(`cbbench serve`, the fake server, the telemetry overhead check's metrics server). The
launcher waits for it (or for the child to die, or the timeout), then keeps draining the
child's output in a thread so a chatty server can never block on a full pipe. Leaving the
block sends SIGTERM and, if the child lingers, SIGKILL. (vLLM, a foreign program, is waited
for by polling its /health instead: harness/servers/peer_engines.py.)

Nothing it starts outlives it: the child runs in its own process group, and stopping it (a
failed start included) ends with SIGKILL to whatever of that group is left (the engine
process, a compiler); the child is told the launcher's pid (LIFELINE_ENV) and exits if the
launcher dies first (reference_engine/server/lifeline.py). The readiness limit grows by
KERNEL_BUILD_ALLOWANCE_S once the child says it builds or waits for the C++ kernels (lines
starting with KERNEL_LINE_PREFIX, kernels/build.py, echoed on our stderr): a build is
progress, not a hang.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from cbbench.harness.errors import CbbenchError
from cbbench.reference_engine.server.lifeline import LIFELINE_ENV

READY_MARK = ": ready at "
READY_PREFIX = "cbbench serve" + READY_MARK
_READY_RE = re.compile(r"^[\w .-]+: ready at (https?://\S+)\s*$")


def ready_line(name: str, url: str) -> str:
    """The line a server prints once it accepts connections."""
    return f"{name}{READY_MARK}{url}"


def parse_ready_line(line: str) -> str | None:
    """The URL of a ready line, else None."""
    m = _READY_RE.match(line)
    return m.group(1) if m else None


STOP_TIMEOUT_S = 15.0
KERNEL_LINE_PREFIX = "cbbench kernels: "  # kernels/build.py's lines (the harness can't import it)
KERNEL_BUILD_ALLOWANCE_S = 960.0  # kernels/build.py's BUILD_WAIT_S and a build after it


@dataclass
class ServerHandle:
    base_url: str  # e.g. http://127.0.0.1:41234 (no trailing slash, no /v1)
    process: subprocess.Popen[str]
    _log: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=200))

    @property
    def log_tail(self) -> str:
        """The child's last output lines (for error messages)."""
        return "".join(self._log)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, wait, then SIGKILL; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)
        kill_group(self.process.pid)
        return self.process.returncode


def kill_group(pgid: int) -> None:
    """SIGKILL what is left of a process group the launcher started (none: no error)."""
    if not hasattr(os, "killpg"):  # not POSIX: no process groups
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def serve_command(
    model: str, scheduler: str, device: str, extra_args: Sequence[str] = ()
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "cbbench.harness.cli",
        "serve",
        "--model",
        model,
        "--scheduler",
        scheduler,
        "--device",
        device,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        *extra_args,
    ]


def start_server(
    cmd: Sequence[str], ready_timeout_s: float = 120.0, name: str | None = None
) -> ServerHandle:
    """Start the child and wait for its ready line; the caller must `stop()` it."""
    cmd = list(cmd)
    name = name or " ".join(cmd[2:4]) or cmd[0]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", LIFELINE_ENV: str(os.getpid())}
    process = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        env=env,
        start_new_session=True,  # its own process group: stop() kills what it started too
    )
    handle = ServerHandle("", process)
    ready = threading.Event()
    building = threading.Event()

    def drain() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            handle._log.append(line)
            if line.startswith(KERNEL_LINE_PREFIX):  # shown: a first start is not silent
                building.set()
                sys.stderr.write(f"{name}: {line}")
            if not ready.is_set() and (url := parse_ready_line(line)):
                handle.base_url = url
                ready.set()
        ready.set()  # EOF: the child exited

    threading.Thread(target=drain, name="cbbench-server-output", daemon=True).start()
    t0 = time.monotonic()
    try:
        while not ready.wait(0.1):
            if process.poll() is not None:  # exited (a helper may still hold the pipe)
                ready.wait(0.5)  # a last line in flight
                break
            limit = ready_timeout_s + (KERNEL_BUILD_ALLOWANCE_S if building.is_set() else 0.0)
            if time.monotonic() - t0 > limit:
                handle.stop()
                raise CbbenchError(
                    f"{name} did not become ready within {limit:g}s "
                    f"(command: {' '.join(cmd[2:])}); last output: {_last_line(handle)}"
                )
    except BaseException:  # Ctrl-C while waiting: the child goes too
        handle.stop()
        raise
    if not handle.base_url:
        code = handle.stop()
        raise CbbenchError(
            f"{name} exited with code {code} before it was ready: {_last_line(handle)}"
        )
    return handle


@contextlib.contextmanager
def launch_server(
    cmd: Sequence[str], ready_timeout_s: float = 120.0, name: str | None = None
) -> Iterator[ServerHandle]:
    """A ready server for the duration of the block; stopped cleanly on exit."""
    handle = start_server(cmd, ready_timeout_s, name)
    try:
        yield handle
    finally:
        handle.stop()


def start_reference_server(
    model: str = "tiny",
    scheduler: str = "continuous",
    device: str = "cpu",
    extra_args: Sequence[str] = (),
    ready_timeout_s: float = 120.0,
) -> ServerHandle:
    """Start `cbbench serve` and wait until it is ready; the caller must `stop()` it."""
    cmd = serve_command(model, scheduler, device, extra_args)
    return start_server(cmd, ready_timeout_s, name="cbbench serve")


def fake_server_command(config_json: str = "", procs: int = 1) -> list[str]:
    """The fake OpenAI server (harness/servers/fake_server.py) as a child process."""
    cmd = [sys.executable, "-m", "cbbench.harness.servers.fake_server", "--procs", str(procs)]
    return [*cmd, "--config", config_json] if config_json else cmd


def _last_line(handle: ServerHandle) -> str:
    lines = [ln.strip() for ln in handle._log if ln.strip()]
    return lines[-1][:300] if lines else "(no output)"


@contextlib.contextmanager
def launch_reference_server(
    model: str = "tiny",
    scheduler: str = "continuous",
    device: str = "cpu",
    extra_args: Sequence[str] = (),
    ready_timeout_s: float = 120.0,
) -> Iterator[ServerHandle]:
    """A ready reference server for the duration of the block; stopped cleanly on exit."""
    cmd = serve_command(model, scheduler, device, extra_args)
    with launch_server(cmd, ready_timeout_s, name="cbbench serve") as handle:
        yield handle
