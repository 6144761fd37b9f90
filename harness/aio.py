"""The load generator's event loop: uvloop when it is installed, else asyncio's own.

uvloop (libuv) roughly halves the loop's own cost per I/O callback; it is an optional
accelerator (`pip install cbbench[fast]`): nothing needs it, and `CBBENCH_NO_UVLOOP=1` (or
`use_uvloop=False`) runs the pure asyncio loop, which stays tested.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_name(use_uvloop: bool = True) -> str:
    """ "uvloop" when `run` would use it, else "asyncio"."""
    if not use_uvloop or os.environ.get("CBBENCH_NO_UVLOOP"):
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run(coro: Coroutine[Any, Any, T], use_uvloop: bool = True) -> T:
    """`asyncio.run(coro)` on uvloop's loop when available."""
    if loop_name(use_uvloop) == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)
