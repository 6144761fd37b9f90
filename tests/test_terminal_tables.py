"""Issue 51, findings 19 and 21: on a terminal `sim` and `quality` print rich tables as bench
does; piped, the same table is Markdown, one row a line. A pseudo-terminal stands in for the
user's terminal."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

import pytest

CLI = [sys.executable, "-m", "cbbench.harness.cli"]
COMMANDS = {
    "sim": ["sim", "--workload", "mixed", "--num-requests", "8"],
    "quality": ["quality", "--model", "tiny", "--num-seqs", "1", "--prompt-len", "8",
                "--gen-len", "2", "--kv-cache-dtype", "int8"],
}  # fmt: skip
SLOW = {"quality"}  # builds a model twice: behind the slow marker (sim is the same table code)


def on_a_terminal(argv: list[str], timeout: float = 120.0) -> str:
    main, child = pty.openpty()
    env = {**os.environ, "COLUMNS": "160", "LINES": "50", "TERM": "xterm"}
    proc = subprocess.Popen([*CLI, *argv], stdout=child, stderr=child, env=env)
    os.close(child)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(main, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
    finally:
        proc.kill() if proc.poll() is None else None
        proc.wait(10)
        os.close(main)
    assert proc.returncode == 0, out.decode(errors="replace")[-2000:]
    return out.decode(errors="replace")


@pytest.mark.parametrize(
    "command", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in COMMANDS]
)
def test_tables_on_a_terminal_and_piped(command: str) -> None:
    shown = on_a_terminal(COMMANDS[command])
    assert "┏" in shown and "┃" in shown, shown[-2000:]  # a rich table
    assert "| --- |" not in shown  # not raw Markdown
    piped = subprocess.run([*CLI, *COMMANDS[command]], capture_output=True, text=True,
                           timeout=120, check=True)  # fmt: skip
    assert "┏" not in piped.stdout and "| --- |" in piped.stdout
    rows = [ln for ln in piped.stdout.splitlines() if ln.startswith("| ")]
    assert rows and all(ln.endswith("|") for ln in rows)  # a row is one line
