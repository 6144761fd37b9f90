"""Telemetry samplers start before t0, so their start-up (the first /metrics scrape, NVML's
init, a powercap read: 70-170 ms) stays out of the measured window: the first request leaves
at t0, not after them. They are started with an anchor taken just before; their samples are
held until t0 is known and then stamped from t0 (`t_s` moved by t0 - anchor), so a sample
before the first request has a negative `t_s`, as the window's first scrape should.

The runner starts them on the load's "ready" event: after warmup requests (the window's
counters must not hold those) and the connections before t0, before t0 is chosen.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class SampleClock:
    def __init__(self, sink: Callable[[dict], None]) -> None:
        self.sink = sink
        self.anchor_ns = time.monotonic_ns()
        self.t0_ns: int | None = None
        self._held: list[dict] = []
        self._lock = threading.Lock()

    def start(self) -> int:
        """The anchor the samplers are started with (now)."""
        self.anchor_ns = time.monotonic_ns()
        return self.anchor_ns

    def add(self, sample: dict) -> None:
        with self._lock:
            if self.t0_ns is None:
                self._held.append(sample)
                return
        self.sink(self._moved(sample))

    def set_t0(self, t0_ns: int) -> None:
        with self._lock:
            self.t0_ns = t0_ns
            held, self._held = self._held, []
        for s in held:
            self.sink(self._moved(s))

    def _moved(self, sample: dict) -> dict:
        assert self.t0_ns is not None
        t = sample.get("t_s")
        if not isinstance(t, (int, float)):
            return sample
        return {**sample, "t_s": t - (self.t0_ns - self.anchor_ns) / 1e9}
