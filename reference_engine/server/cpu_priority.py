"""The API process's CPU scheduling class: `cbbench serve --api-rt-priority N`.

On a machine whose cores the engine and a load generator keep busy, the API process's short
bursts of work (accept, parse, answer) wait for the kernel to give it a core: measured on a
2-core VM, `/v1/models` p99 12.7-24.8 ms with the engine at full batch, p50 1.1 ms, while
the same server answers in 0.07 ms idle. Under SCHED_RR a woken API thread preempts the
engine at once: p99 1.45-3.0 ms, tokens/s 4-13 % lower in the same pairs (docs/performance.md). The API process only ever
runs short bursts; the kernel's RT throttling (kernel.sched_rt_runtime_us, 95 % by default)
still leaves every core's last 5 % to normal tasks.

SCHED_RESET_ON_FORK: processes and threads started afterwards (the engine process, a thread
pool created later) get the normal class back.
"""

from __future__ import annotations

import os


def raise_to_realtime(priority: int) -> str | None:
    """Every thread of this process to SCHED_RR at `priority` (1-99); None, or why not."""
    if not 1 <= priority <= 99:
        raise ValueError(f"real-time priority must be in [1, 99], got {priority}")
    if not hasattr(os, "sched_setscheduler") or not os.path.isdir("/proc/self/task"):
        return "real-time scheduling needs Linux"
    policy = os.SCHED_RR | getattr(os, "SCHED_RESET_ON_FORK", 0)
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setscheduler(int(tid), policy, os.sched_param(priority))
            except ProcessLookupError:  # a thread that ended meanwhile
                continue
    except PermissionError:
        return "not permitted (needs root or CAP_SYS_NICE, and an RT budget in this cgroup)"
    return None
