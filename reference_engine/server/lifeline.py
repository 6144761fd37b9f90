"""Child processes die with their parent, even when the parent is killed with SIGKILL.

`kill -9` of `cbbench bench --workers 2` used to leave both workers (and, through them,
multiprocessing's resource tracker) alive for minutes, blocked on a queue write to nobody.
Two guards, both started first thing in the child:

- Linux: `prctl(PR_SET_PDEATHSIG, SIGKILL)` - the kernel kills the child the moment the
  parent thread that started it exits. Then the child checks its parent is still the one it
  was started by (the parent may have died before the prctl call).
- Everywhere: a daemon thread that polls `os.getppid()` and exits the process when the
  parent changes (reparented to init or a subreaper).

The resource tracker needs no guard: it exits when the last process holding its pipe (the
parent and the workers) is gone.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
POLL_S = 0.5


def _prctl_pdeathsig(sig: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(parent_pid: int, poll_s: float = POLL_S) -> None:
    """Call first thing in a child process; `parent_pid` is os.getpid() in the parent."""
    _prctl_pdeathsig(signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)  # the parent died before we were watching

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="cbbench-lifeline", daemon=True).start()
