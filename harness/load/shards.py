"""One workload over several load generators: the N-way split `--workers N` uses inside one
host and `--shard I/N` uses across hosts, a shared wall-clock start (`--start-at`), and the
host's clock state recorded next to it.

The split: the workload's jobs are grouped into units (a session's turns, or one lone
request: `sessions.group_sessions`), and unit u goes to part u mod N; the first `--warmup`
requests' warm-up copies are dealt the same way, request k to part k mod N. A concurrency of
C is shared as C // N, plus one for the first C mod N parts. Shard I of N is exactly what
worker I of `--workers N` would get, so N hosts send every request once between them, each
session from one host.

Shards are 0-based (`--shard 0/3`, `1/3`, `2/3`), like worker numbers.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import datetime as dt
import hashlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from cbbench.harness.errors import CbbenchError
from cbbench.harness.load.sessions import group_sessions

T = TypeVar("T")

MAX_START_AHEAD_S = 3600.0  # --start-at at most an hour ahead: a typo, not a plan


@dataclass(frozen=True)
class Shard:
    index: int  # 0-based
    count: int

    def __post_init__(self) -> None:
        assert 0 <= self.index < self.count, (self.index, self.count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """'I/N' (0-based I) -> Shard; CbbenchError naming --shard otherwise."""
    head, sep, tail = text.strip().partition("/")
    try:
        index, count = int(head), int(tail)
    except ValueError:
        index = count = -1
    if not sep or count < 1:
        raise CbbenchError(f"--shard {text}: expected I/N with N >= 1, e.g. 0/3")
    if not 0 <= index < count:
        raise CbbenchError(
            f"--shard {text}: I is 0-based, from 0 to {count - 1} (shards 0/{count} .. "
            f"{count - 1}/{count})"
        )
    return Shard(index, count)


def parse_start_at(text: str, now: float | None = None) -> float:
    """A wall-clock start as unix seconds: '1764770400.5' or an ISO 8601 time with its zone
    ('2026-12-03T14:00:00Z', '...+01:00'). In the past or more than an hour ahead: an error."""
    now = time.time() if now is None else now
    at = _unix_time(text)
    if not math.isfinite(at):
        raise CbbenchError(f"--start-at {text}: not a time")
    if at <= now:
        raise CbbenchError(f"--start-at {text}: {now - at:.1f} s in the past")
    if at - now > MAX_START_AHEAD_S:
        raise CbbenchError(
            f"--start-at {text}: {at - now:.0f} s ahead, more than {MAX_START_AHEAD_S:.0f} s"
        )
    return at


def _unix_time(text: str) -> float:
    with contextlib.suppress(ValueError):
        return float(text)
    try:
        parsed = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        parsed = None
    if parsed is None:
        raise CbbenchError(
            f"--start-at {text}: expected unix seconds or an ISO time such as 2026-12-03T14:00:00Z"
        )
    if parsed.tzinfo is None:
        raise CbbenchError(f"--start-at {text}: give the time zone (Z or +HH:MM): hosts may differ")
    return parsed.timestamp()


def deal(items: Sequence[T], n: int) -> list[list[T]]:
    """Item k to part k mod n (n parts, some maybe empty)."""
    assert n >= 1, n
    return [list(items[i::n]) for i in range(n)]


def share(total: int | None, n: int, i: int) -> int | None:
    """Part i's share of a concurrency of `total` over n parts (None: no cap)."""
    if total is None:
        return None
    return total // n + (i < total % n)


def shard_share(total: int | None, shard: Shard | None) -> int | None:
    """The concurrency one host runs: all of `total`, or its shard's share."""
    return total if shard is None else share(total, shard.count, shard.index)


def split_jobs(jobs: Sequence[T], n: int) -> list[list[T]]:
    """The jobs of each of n parts: sessions whole, units dealt round-robin."""
    return [[j for unit in part for j in unit] for part in deal(group_sessions(jobs), n)]


def workload_digest(requests: Sequence[Any]) -> str:
    """A short hash of what the split depends on: every request's index, lengths, arrival and
    session (two shards of one run have the same; a different seed or trace does not)."""
    h = hashlib.sha256()
    for r in requests:
        key = (r.index, r.prompt_len, r.output_len, r.arrival_s, r.session_id, r.turn)
        h.update(repr(key).encode())
    return h.hexdigest()[:16]


def shard_meta(shard: Shard, requests: Sequence[Any], concurrency: int | None, plans) -> dict:
    """run.json's "shard" of a `--shard` run: which part, what it sends (`plans`: its
    WorkerPlans), the whole run's concurrency and the workload's digest."""
    return {
        "index": shard.index,
        "count": shard.count,
        "requests": sum(len(p.jobs) for p in plans),
        "warmup": sum(len(p.warmup_jobs) for p in plans),
        "concurrency_total": concurrency,
        "workload_digest": workload_digest(requests),
    }


def clock_meta(start_at: float | None) -> dict:
    """run.json's "clock" at the start; the runner fills in t0 (unix seconds) and how late
    the load generator was ready for it (`late_start_s`, > 0 when --start-at came first)."""
    return {
        "start_at_unix_s": start_at,
        "t0_unix_s": None,
        "late_start_s": None,
        "kernel": clock_state(),
    }


def monotonic_ns_at(unix_s: float) -> int:
    """The CLOCK_MONOTONIC time (ns) at wall-clock `unix_s`: both clocks read back to back,
    the wall clock between two monotonic reads (error: the gap between them, ~100 ns)."""
    a = time.monotonic_ns()
    wall = time.time_ns()
    b = time.monotonic_ns()
    return (a + b) // 2 + round(unix_s * 1e9) - wall


def unix_s_at(monotonic_ns: int) -> float:
    """The wall-clock time (unix seconds) at CLOCK_MONOTONIC `monotonic_ns`."""
    a = time.monotonic_ns()
    wall = time.time_ns()
    b = time.monotonic_ns()
    return (wall + monotonic_ns - (a + b) // 2) / 1e9


class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class _Timex(ctypes.Structure):  # struct timex (linux/timex.h), read-only use (modes = 0)
    _fields_ = [
        ("modes", ctypes.c_uint),
        ("offset", ctypes.c_long),
        ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long),
        ("esterror", ctypes.c_long),
        ("status", ctypes.c_int),
        ("constant", ctypes.c_long),
        ("precision", ctypes.c_long),
        ("tolerance", ctypes.c_long),
        ("time", _Timeval),
        ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long),
        ("jitter", ctypes.c_long),
        ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long),
        ("jitcnt", ctypes.c_long),
        ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long),
        ("stbcnt", ctypes.c_long),
        ("tai", ctypes.c_int),
        ("_reserved", ctypes.c_int * 11),
    ]


STA_UNSYNC = 0x0040
STA_NANO = 0x2000
TIME_ERROR = 5


def clock_state() -> dict:
    """What this host's kernel says about its wall clock (adjtimex(2), read only): whether an
    NTP/PTP daemon keeps it synchronised, its own estimated and maximum error, the offset it
    is correcting. Not a measured offset to other hosts: cbbench has no cheap way to get one
    finer than the HTTP Date header's whole seconds. {"source": None} where unavailable."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        tx = _Timex()
        state = libc.adjtimex(ctypes.byref(tx))
    except (OSError, AttributeError):
        return {"source": None}
    if state < 0:
        return {"source": None}
    offset_unit = 1e-9 if tx.status & STA_NANO else 1e-6
    return {
        "source": "adjtimex",
        "synchronised": state != TIME_ERROR and not tx.status & STA_UNSYNC,
        "est_error_s": tx.esterror * 1e-6,
        "max_error_s": tx.maxerror * 1e-6,
        "offset_s": tx.offset * offset_unit,
    }
