"""Where a served engine's processes run, and what CPU each of them spends (Linux /proc).

compare-engines measures two servers the same way: the engine's compute on `cores` (the
reference's engine processes bound by `bind_engine`, vLLM's OpenMP threads by its own
VLLM_CPU_OMP_THREADS_BIND), and, when this process may use other cores too, the server's API
process and the load generator (this process and the workers it starts) moved off them
(`host_work_off`): the rule vLLM's CPU guide gives (leave cores to the serving framework),
applied to both. Without it the API process and the load generator wake on the engine's core
and preempt its compute thread at every streamed token.

`ServerCpu` splits a server's CPU seconds into its API process (the pid it was started as)
and its engine processes (every live descendant), so a figure never mixes the two.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the name (state, ppid, ...), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _ticks(fields: list[str]) -> int:
    return int(fields[11]) + int(fields[12])  # utime + stime


def _processes() -> dict[int, list[str]]:
    procs: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (f := _stat(int(entry.name))) is not None:
            procs[int(entry.name)] = f
    return procs


def descendants(pid: int, procs: dict[int, list[str]] | None = None) -> set[int]:
    """Live descendants of `pid` (children, their children, ...)."""
    procs = _processes() if procs is None else procs
    parents = {p: int(f[1]) for p, f in procs.items()}
    tree: set[int] = set()
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        children = [c for c, pp in parents.items() if pp == parent and c not in tree]
        tree.update(children)
        frontier.extend(children)
    return tree


@dataclass(frozen=True)
class ServerCpu:
    """CPU seconds (user + system) of a server's API process and of its engine processes."""

    api_s: float
    engine_s: float

    @property
    def total_s(self) -> float:
        return self.api_s + self.engine_s

    def __sub__(self, other: ServerCpu) -> ServerCpu:
        return ServerCpu(self.api_s - other.api_s, self.engine_s - other.engine_s)


def server_cpu(pid: int) -> ServerCpu | None:
    """The server's CPU so far, split; None where /proc cannot tell (not Linux, exited)."""
    procs = _processes()
    if pid not in procs:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    engine = sum(_ticks(procs[p]) for p in descendants(pid, procs) if p in procs)
    return ServerCpu(_ticks(procs[pid]) / hz, engine / hz)


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a running process and all its live descendants (vLLM
    computes in worker processes), from Linux /proc; None elsewhere."""
    cpu = server_cpu(pid)
    return None if cpu is None else cpu.total_s


def load_generator_cpu_s() -> float:
    """CPU seconds of this process and of the children it has waited for (spawned workers)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _set_threads(pid: int, cores: set[int]) -> None:
    """Every thread of one process (not its children) to `cores`; threads it starts later
    inherit the affinity of the thread that starts them."""
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(task.name), cores)


def bind_engine(server_pid: int, cores: set[int]) -> None:
    """Bind every thread of the server's engine processes (its children; the API process
    is placed by `host_work_off`) to `cores`; cores this process may not use are dropped."""
    cores = cores & os.sched_getaffinity(0) or os.sched_getaffinity(0)
    procs = _processes()
    for child in [p for p, f in procs.items() if int(f[1]) == server_pid]:
        _set_threads(child, cores)


def spare_cores(engine_cores: set[int]) -> set[int]:
    """The cores this process may use that are not the engine's (empty: none to spare)."""
    return os.sched_getaffinity(0) - engine_cores


@contextlib.contextmanager
def host_work_off(server_pid: int, engine_cores: set[int]) -> Iterator[set[int]]:
    """For the block: the server's API process and this process (the load generator; the
    workers it spawns inherit it) on the cores other than `engine_cores`. Yields those cores
    (empty when there are none to spare: then nothing moves). This process's affinity is
    restored afterwards; the server's is not (it is stopped after the measurement)."""
    spare = spare_cores(engine_cores)
    if not spare:
        yield spare
        return
    saved = os.sched_getaffinity(0)
    _set_threads(server_pid, spare)
    _set_threads(os.getpid(), spare)
    try:
        yield spare
    finally:
        _set_threads(os.getpid(), saved)


# engine steps so far, from a server's /metrics: one histogram observation a step
STEP_COUNTS = ("cbbench:scheduler_time_seconds_count", "vllm:iteration_tokens_total_count")


def engine_steps(base_url: str) -> int | None:
    """The server's engine steps so far (its /metrics); None where it says none we know."""
    import httpx
    from cbbench.harness.telemetry.prom import parse_metrics

    try:
        scrape = parse_metrics(httpx.get(f"{base_url}/metrics", timeout=10, trust_env=False).text)
    except (httpx.HTTPError, ValueError):
        return None
    for name in STEP_COUNTS:
        if rows := scrape.samples.get(name):
            return int(sum(v for _, v in rows))
    return None


@dataclass(frozen=True)
class ThreadTimes:
    """Per thread of a server's engine processes: (CPU ns, ns runnable but waiting for a
    core) from /proc/PID/task/TID/schedstat, at one moment."""

    at_ns: int
    threads: dict[int, tuple[int, int]]


def engine_thread_times(server_pid: int) -> ThreadTimes:
    threads: dict[int, tuple[int, int]] = {}
    for pid in descendants(server_pid):
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    cpu, wait, _ = (task / "schedstat").read_text().split()
                    threads[int(task.name)] = (int(cpu), int(wait))
    return ThreadTimes(time.monotonic_ns(), threads)


def compute_thread_split(before: ThreadTimes, after: ThreadTimes) -> dict[str, float] | None:
    """Where the wall time between two snapshots went for the engine's busiest thread (its
    compute thread): on a core, runnable but waiting for one (preempted: other processes
    on its core), and the rest (blocked: waiting for work). None without schedstat."""
    best: tuple[int, int] | None = None
    for tid, (cpu, wait) in after.threads.items():
        cpu0, wait0 = before.threads.get(tid, (0, 0))
        if best is None or cpu - cpu0 > best[0]:
            best = (cpu - cpu0, wait - wait0)
    if best is None:
        return None
    wall = (after.at_ns - before.at_ns) / 1e9
    on_cpu, waiting = best[0] / 1e9, best[1] / 1e9
    return {"wall_s": wall, "on_cpu_s": on_cpu, "waiting_for_core_s": waiting,
            "blocked_s": max(0.0, wall - on_cpu - waiting)}  # fmt: skip
