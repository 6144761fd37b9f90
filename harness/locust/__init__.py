"""Locust glue: the cbbench user class, record collection and merging across Locust workers,
and a cbbench page in Locust's web UI. `cbbench locust` (harness/cli/locust.py) runs
`python -m locust -f LOCUSTFILE` with the settings in `CBBENCH_LOCUST_SETTINGS`.

Importing this package does not import Locust (which monkey-patches the process for gevent);
only `locustfile.py`, `hooks.py`, `user.py` and `run_state.py` do.

Layer: Locust glue (a second load generator on the same client and records).
Imports: client, load, results, telemetry, workloads.
"""

from __future__ import annotations

import select
import sys
from pathlib import Path

# Locust monkey-patches the process for gevent before it loads a locustfile, and the patched
# `select` has no `epoll`; trio needs it at import, and httpcore (under httpx) imports trio
# whenever it is installed. Nothing in cbbench uses trio, so a patched process does without.
if not hasattr(select, "epoll") and "trio" not in sys.modules:
    sys.modules["trio"] = None  # type: ignore[assignment]

LOCUSTFILE = Path(__file__).with_name("locustfile.py")

__all__ = ["LOCUSTFILE"]
