"""End a finished server process without the interpreter's teardown.

With torch loaded, Python's own exit after the last line took 0.5-1 s: its final garbage
collections walk the whole heap (torch's operator registry, triton's bindings) several
times. A `cbbench serve` paid it twice on every stop, in the engine process and then in the
API process. `exit_now` does what an exit must (waits for non-daemon threads, runs the
atexit handlers: logging's flush, multiprocessing's and tempfile's clean-up; flushes
stdout and stderr) and then ends the process at once. Call it only when everything of
value is closed: the HTTP server stopped, the engine shut down, its sockets closed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn

JOIN_S = 5.0  # the most a finished server waits for each non-daemon thread


def exit_now(code: int = 0) -> NoReturn:
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon and thread.is_alive():
            thread.join(JOIN_S)  # as the interpreter's exit would, but bounded: a hung one is left
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # closed or broken: nothing left to save
            stream.flush()
    os._exit(code)
