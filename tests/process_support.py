"""Starting a child process in a test and waiting for what it prints, never without a bound.

`readline_within(proc, timeout_s, what)` reads one line of the child's stdout (the caller
keeps the pipe); `Lines(proc, what)` drains it in a thread so it never fills, and `until`
waits for a line containing a needle. Either fails the test by name when the child prints
nothing in time or exits first: the child (and its process group, when it leads one) is
killed and its output (its stderr pipe, or the log file it writes to) is in the message.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

STOP_S = 10.0


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the child (its whole group when it leads one) and reap it, bounded."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(STOP_S)


def output_tail(proc: subprocess.Popen, log: Path | None = None, chars: int = 3000) -> str:
    """The child's stderr (a pipe, read for at most STOP_S after it died) or its log file."""
    if log is not None:
        return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"
    if proc.stderr is None:
        return "(stderr not captured)"
    box: list[str | bytes] = []
    t = threading.Thread(target=lambda: box.append(proc.stderr.read()), daemon=True)
    t.start()
    t.join(STOP_S)
    text = box[0] if box else ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text[-chars:] or "(empty)"


def _fail(proc: subprocess.Popen, what: str, why: str, log: Path | None, seen: str = "") -> None:
    code = proc.poll()
    kill(proc)
    state = f"it exited with code {code}" if code is not None else "it was killed"
    seen = f"its stdout so far:\n{seen[-2000:]}\n" if seen else ""
    pytest.fail(f"{what} {why}; {state}; {seen}its output:\n{output_tail(proc, log)}")


def readline_within(
    proc: subprocess.Popen, timeout_s: float, what: str = "the child", log: Path | None = None
) -> str:
    """One line of the child's stdout, or the test fails within timeout_s."""
    assert proc.stdout is not None, "start the child with stdout=subprocess.PIPE"
    box: list[str | bytes] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    line = box[0] if box else ""
    if not line:
        why = "closed its stdout" if box else f"printed nothing within {timeout_s:g}s"
        _fail(proc, what, why, log)
    return line.decode(errors="replace") if isinstance(line, bytes) else line


class Lines:
    """The child's stdout, drained line by line in a daemon thread."""

    def __init__(self, proc: subprocess.Popen, what: str = "the child", log: Path | None = None):
        assert proc.stdout is not None, "start the child with stdout=subprocess.PIPE"
        self.proc, self.what, self.log = proc, what, log
        self.seen: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._drain, name="test-child-stdout", daemon=True).start()

    def _drain(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self._q.put(line.decode(errors="replace") if isinstance(line, bytes) else line)
        self._q.put(None)

    def until(self, needle: str, timeout_s: float) -> str:
        """The first (next) line containing needle, or the test fails within timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                why = f"did not print {needle!r} within {timeout_s:g}s"
                _fail(self.proc, self.what, why, self.log, "".join(self.seen))
            if line is None:
                self._q.put(None)  # EOF stays EOF
                why = f"closed its stdout before printing {needle!r}"
                _fail(self.proc, self.what, why, self.log, "".join(self.seen))
            self.seen.append(line)
            if needle in line:
                return line

    def wait_exit(self, timeout_s: float) -> int:
        """The child's exit code once it exits (its stdout read to the end), bounded."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                _fail(self.proc, self.what, f"did not exit within {timeout_s:g}s", self.log,
                      "".join(self.seen))  # fmt: skip
            if line is None:
                self._q.put(None)
                break
            self.seen.append(line)
        try:
            return self.proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _fail(self.proc, self.what, f"did not exit within {timeout_s:g}s", self.log)
            raise  # unreachable: pytest.fail raised
