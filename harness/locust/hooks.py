"""Locust event listeners that drive a `LocustRun` (registered once, on import).

init: settings from the environment, the run state, the web page; test_start: t0 and the
workers' plans; test_stopping: no new requests; test_stop: drain (records in, the unfinished
counted) and run.json so far; quitting: the final run.json.
A setup error (bad workload, unreachable server) ends the process with one line and exit 2.

Ctrl-C: Locust relies on Python's default SIGINT handler raising KeyboardInterrupt in the
main greenlet (then it shuts down). Under gevent that exception lands in whichever greenlet
runs Python code when the signal is checked; when that is a patched thread (the telemetry
sampler parsing /metrics, several times a second), `threading` catches it ("Exception in
thread ...") and Locust never hears of it: the process kept running after Ctrl-C, about one
time in five. `install_ctrl_c` handles SIGINT in gevent's hub instead and raises the
KeyboardInterrupt in the main greenlet, always.
"""

from __future__ import annotations

import logging
import signal
import sys

import gevent
from cbbench.harness.errors import CbbenchError
from cbbench.harness.locust.run_state import LocustRun
from cbbench.harness.locust.settings import LocustSettings
from cbbench.workloads.errors import WorkloadError
from locust import constant_pacing, events
from locust.stats import CSV_STATS_INTERVAL_SEC

log = logging.getLogger("cbbench.locust")


def _ctrl_c() -> None:
    gevent.get_hub().parent.throw(KeyboardInterrupt())  # the main greenlet, as Locust expects


def install_ctrl_c() -> None:
    """SIGINT -> KeyboardInterrupt in the main greenlet, wherever the signal arrives."""
    gevent.signal_handler(signal.SIGINT, _ctrl_c)


install_ctrl_c()


def _run(environment) -> LocustRun | None:
    return getattr(environment, "cbbench", None)


@events.init.add_listener
def on_init(environment, **_kw) -> None:
    from cbbench.harness.locust.user import CbbenchUser

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per /metrics scrape
    try:
        settings = LocustSettings.from_env()
        run = LocustRun(environment, settings)
    except (CbbenchError, WorkloadError) as exc:
        print(f"cbbench locust: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    environment.cbbench = run
    if run.role == "worker":
        environment.events.spawning_complete.add_listener(lambda **_kw: run.on_spawning_complete())
    if settings.pacing_s:
        CbbenchUser.wait_time = constant_pacing(settings.pacing_s)
    if environment.web_ui is not None and run.collector is not None:
        from cbbench.harness.locust import webpage

        webpage.install(environment, run)


@events.test_start.add_listener
def on_test_start(environment, **_kw) -> None:
    run = _run(environment)
    if run is not None and run.role != "worker":
        run.start_test()


@events.test_stopping.add_listener
def on_test_stopping(environment, **_kw) -> None:
    run = _run(environment)
    if run is not None:
        run.stopping()


@events.test_stop.add_listener
def on_test_stop(environment, **_kw) -> None:
    run = _run(environment)
    if run is None:
        return
    run.drain()
    if run.collector is not None and not run.collector.closed:
        run.collector.write("stopped")


@events.quitting.add_listener
def on_quitting(environment, **_kw) -> None:
    run = _run(environment)
    if run is None:
        return
    run.close()
    opts = environment.parsed_options
    if run.role != "worker" and opts is not None and getattr(opts, "csv_prefix", None):
        # Locust rewrites its --csv files once a second and not at exit: let it write once
        # more, so the files hold every sample (none are fired after close())
        gevent.sleep(CSV_STATS_INTERVAL_SEC + 0.2)
