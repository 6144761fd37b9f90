"""Suite-wide guards."""

from __future__ import annotations

import sys

import pytest


def pytest_collection_finish(session: pytest.Session) -> None:
    """Importing locust monkey-patches sockets, threads and ssl for the whole process (gevent);
    a test module that imports it at collection time breaks every test after it. Locust runs
    in its own processes in this suite (cbbench locust, the selftest comparison)."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("socket"):
        raise pytest.UsageError(
            "a test module imported locust (gevent patched the pytest process at collection): "
            "import it inside the test or in a subprocess, check with importlib.util.find_spec"
        )
