"""Child processes die with their parent, even when the parent is killed with SIGKILL.

`kill -9` of `cbbench bench --workers 2` used to leave both workers (and, through them,
multiprocessing's resource tracker) alive for minutes, blocked on a queue write to nobody.
Two guards, both started first thing in the child:

- Linux: `prctl(PR_SET_PDEATHSIG, SIGKILL)` - the kernel kills the child the moment the
  parent thread that started it exits. Then the child checks its parent is still the one it
  was started by (the parent may have died before the prctl call).
- Everywhere: a daemon thread that polls `os.getppid()` and exits the process when the
  parent changes (reparented to init or a subreaper), killing its own descendants first (a
  compiler the engine process runs for a kernel build, say).

The resource tracker needs no guard: it exits when the last process holding its pipe (the
parent and the workers) is gone.

Commands started by the harness's launcher (harness/servers/launcher.py) get the launcher's
pid in LIFELINE_ENV and call `die_with_launcher()` first thing: the poll only (the prctl
signal fires when the *thread* that started the child exits, and the launcher may start
children from short-lived threads). Such a child leads its own process group, so on the
launcher's death it takes the whole group (its engine process, a compiler) with it.
"""

from __future__ import annotations

import contextlib
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


LIFELINE_ENV = "CBBENCH_LIFELINE_PID"


def preexec_die_with_parent() -> None:
    """A Popen `preexec_fn` for a child we cannot change (vLLM): the kernel SIGKILLs it when
    the thread that started it dies, a SIGKILL of the whole command included (Linux)."""
    _prctl_pdeathsig(signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (Linux /proc; elsewhere none)."""
    parent: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parent[int(name)] = int(fields[1])
    found: list[int] = []
    frontier = {pid}
    while frontier:
        kids = {c for c, pp in parent.items() if pp in frontier}
        found += sorted(kids)
        frontier = kids
    return found


def kill_descendants() -> None:
    for pid in descendants(os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def die_with_parent(
    parent_pid: int, poll_s: float = POLL_S, pdeathsig: bool = True, group: bool = False
) -> None:
    """Call first thing in a child process; `parent_pid` is os.getpid() in the parent.
    pdeathsig=False: only poll (the parent may have started us from a short-lived thread);
    group: on the parent's death kill this process's whole group (when it leads it)."""
    if pdeathsig:
        _prctl_pdeathsig(signal.SIGKILL)

    def die() -> None:
        kill_descendants()  # a compiler building kernels for us, say
        if group and hasattr(os, "killpg") and os.getpgid(0) == os.getpid():
            os.killpg(0, signal.SIGKILL)  # and whatever else of our group is left, us too
        os._exit(1)

    if os.getppid() != parent_pid:
        die()  # the parent died before we were watching

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent_pid:
                die()

    threading.Thread(target=watch, name="cbbench-lifeline", daemon=True).start()


def die_with_launcher() -> None:
    """Die (with this process group) when the launcher named in LIFELINE_ENV dies; no-op when
    the variable is unset or names another process than our parent. Removes it, so this
    process's own children are not misled."""
    value = os.environ.pop(LIFELINE_ENV, "")
    if value.isdigit() and int(value) == os.getppid():  # not through a wrapper (netns, sh)
        die_with_parent(int(value), pdeathsig=False, group=True)
