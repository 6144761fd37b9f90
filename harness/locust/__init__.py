"""Locust glue: the cbbench user class, record collection and merging across Locust workers,
and a cbbench page in Locust's web UI. `cbbench locust` (harness/cli/locust.py) runs
`python -m locust -f LOCUSTFILE` with the settings in `CBBENCH_LOCUST_SETTINGS`.

Importing this package does not import Locust (which monkey-patches the process for gevent);
only `locustfile.py`, `hooks.py`, `user.py` and `run_state.py` do.
"""

from __future__ import annotations

from pathlib import Path

LOCUSTFILE = Path(__file__).with_name("locustfile.py")

__all__ = ["LOCUSTFILE"]
