"""Load sweeps: one benchmark per load level into one folder (`sweep.json` + a run folder per
level), and a watch that stops a level early once the server is clearly over-saturated.

The watch is a telemetry sampler (the runner's `start(t0_ns, sink)` / `stop()` / `summary()`
protocol) that tails the level's own `requests.jsonl` and `timeseries.jsonl`; to stop the
level it does what Ctrl-C does, so every finished request is kept.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cbbench.harness.conclusions import saturation
from cbbench.harness.results.run_folder import REQUESTS_FILE, TIMESERIES_FILE


@dataclass
class Level:
    name: str
    rate: float | None = None  # requests/s, open loop (inf = all at once)
    concurrency: int | None = None  # closed loop

    def describe(self) -> str:
        if self.rate is not None:
            return "all at once" if math.isinf(self.rate) else f"rate {self.rate:g}/s"
        return f"concurrency {self.concurrency}"


def parse_list(text: str, what: str, kind=float) -> list:
    from cbbench.harness.errors import CbbenchError

    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CbbenchError(f"{what}: {text!r} is not a comma list of numbers") from None
    if not values or any(v <= 0 for v in values):
        raise CbbenchError(f"{what}: give positive numbers, e.g. 1,2,4,8")
    if len(values) != len(set(values)):
        raise CbbenchError(f"{what}: {text!r} repeats a level")
    return sorted(values)


def _tail_jsonl(path: Path, offset: int) -> tuple[list[dict], int]:
    """Complete new lines since `offset` (a half-written last line waits for next time)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    rows = []
    for line in data[:end].splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows, offset + end


class SaturationWatch:
    """Stops a level when TTFT explodes or the server's waiting queue keeps growing, or when
    the level runs past its time limit."""

    name = "saturation"

    def __init__(self, run_dir: Path, total: int, timeout_s: float, poll_s: float = 0.25) -> None:
        self.run_dir = Path(run_dir)
        self.total = total
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.reason: str | None = None
        self._ttft: list[float] = []
        self._waiting: list[float] = []
        self._done = 0
        self._offsets = {REQUESTS_FILE: 0, TIMESERIES_FILE: 0}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self, t0_ns: int, sink) -> None:
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="saturation-watch")
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def summary(self) -> dict:
        return {"stopped_early": self.reason}

    @property
    def stop_reason(self) -> str | None:  # the runner: stopped by a watch, not Ctrl-C
        return None if self.reason is None else f"over-saturated: {self.reason}"

    def _read(self) -> None:
        rows, self._offsets[REQUESTS_FILE] = _tail_jsonl(
            self.run_dir / REQUESTS_FILE, self._offsets[REQUESTS_FILE]
        )
        for r in rows:
            if r.get("warmup"):
                continue
            self._done += 1
            if r.get("status") == "ok" and isinstance(r.get("ttft_s"), (int, float)):
                self._ttft.append(float(r["ttft_s"]))
        rows, self._offsets[TIMESERIES_FILE] = _tail_jsonl(
            self.run_dir / TIMESERIES_FILE, self._offsets[TIMESERIES_FILE]
        )
        self._waiting += [
            float(s["waiting"]) for s in rows if isinstance(s.get("waiting"), (int, float))
        ]

    def verdict(self) -> str | None:
        """Why the level is clearly over-saturated, or None: the shared rule
        (harness/conclusions/saturation.py), the one `bench` stops by."""
        return saturation.ttft_explosion(self._ttft) or saturation.waiting_growth(self._waiting)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._read()
            if self._done >= self.total:
                return
            reason = self.verdict()
            if reason is None and time.monotonic() - self._t0 > self.timeout_s:
                reason = f"level time limit {self.timeout_s:g}s reached"
            if reason is not None:
                self._fire(reason)
                return

    def _fire(self, reason: str) -> None:
        with self._lock:
            if self._stopped:
                return
            self.reason = reason
            os.kill(os.getpid(), signal.SIGINT)  # the runner's Ctrl-C: keep what finished


def auto_rates(sync_rps: float, max_rps: float, between: int) -> list[float]:
    """Rates strictly between the synchronous and the all-at-once throughput, geometric."""
    if not (sync_rps > 0 and max_rps > sync_rps * 1.05) or between < 1:
        return []
    ratio = max_rps / sync_rps
    return [sync_rps * ratio ** (i / (between + 1)) for i in range(1, between + 1)]
