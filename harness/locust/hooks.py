"""Locust event listeners that drive a `LocustRun` (registered once, on import).

init: settings from the environment, the run state, the web page; test_start: t0 and the
workers' plans; test_stopping: drain; test_stop: run.json so far; quitting: the final run.json.
A setup error (bad workload, unreachable server) ends the process with one line and exit 2.
"""

from __future__ import annotations

import logging
import sys

from cbbench.harness.errors import CbbenchError
from cbbench.harness.locust.run_state import LocustRun
from cbbench.harness.locust.settings import LocustSettings
from cbbench.workloads.errors import WorkloadError
from locust import constant_pacing, events

log = logging.getLogger("cbbench.locust")


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
        run.drain()


@events.test_stop.add_listener
def on_test_stop(environment, **_kw) -> None:
    run = _run(environment)
    if run is not None and run.collector is not None and not run.collector.closed:
        run.collector.write("stopped")


@events.quitting.add_listener
def on_quitting(environment, **_kw) -> None:
    run = _run(environment)
    if run is not None:
        run.close()
