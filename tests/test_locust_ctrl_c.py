"""Ctrl-C reaches Locust's main greenlet even when it lands in a patched thread.

Under gevent, Python's SIGINT handler raises KeyboardInterrupt in whatever greenlet runs
Python code at that moment; in a patched `threading.Thread` (the telemetry sampler)
`threading` swallows it, and `cbbench locust` kept running after Ctrl-C (the rare web-UI
shutdown hang). Here a thread is busy almost all the time, so without the hub's handler the
signal lands in it nearly every time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from process_support import readline_within

SCRIPT = r"""
import sys, threading, time
import gevent
from cbbench.harness.locust import hooks  # patches (via Locust) and installs the handler
if sys.argv[1] == "without":
    import signal
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, as before
def busy():
    while True:
        sum(i * i for i in range(50_000))  # Python bytecode, like parsing /metrics
        gevent.sleep(0)
threading.Thread(target=busy, daemon=True).start()
print("ready", flush=True)
try:
    gevent.sleep(3)
    print("main: no KeyboardInterrupt", flush=True)
except KeyboardInterrupt:
    print("main: KeyboardInterrupt", flush=True)
"""


def _run(mode: str) -> str:
    root = Path(__file__).parent.parent
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=root,
    )
    try:
        assert readline_within(proc, 60, "the gevent script").strip() == "ready"
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return out + err


def test_ctrl_c_reaches_the_main_greenlet():
    for _ in range(2):
        assert "main: KeyboardInterrupt" in _run("with")


def test_without_the_hub_handler_a_busy_thread_swallows_ctrl_c():
    # The cause, shown: Python's own handler lets `threading` eat the KeyboardInterrupt.
    for _ in range(3):  # nearly always the first time
        out = _run("without")
        if "main: no KeyboardInterrupt" in out and "Exception in thread" in out:
            return
    raise AssertionError(f"Ctrl-C was never swallowed by the busy thread:\n{out[-2000:]}")
