"""The fake server's load model: a server with known capacity, noise and warm-up, so run-level
conclusions (steady window, repeats, over-saturation, MLPerf verdicts) can be tested against
a known truth.

- `slots`: requests served at once (0: unlimited); beyond them requests wait FCFS, and the
  wait is added before the first token (a queue, as a busy server's). Capacity is then
  slots / (ttft + (chunks - 1) x itl) requests/s.
- `jitter`: each request's TTFT and chunk gap are multiplied by 1 + N(0, jitter), drawn from
  (seed, request index): the same request gets the same noise on every run.
- `run_jitter`: a speed factor 1 + N(0, run_jitter) multiplies every latency; it is drawn
  anew (from seed and a counter) each time the prefix cache is reset, so a run that starts
  with `--flush-cache` (or each of `--repeats`) meets a server whose speed varies run to run.
- `ramp_s`, `ramp_factor`: the first `ramp_s` seconds after the first request (or after a
  reset) are slower, by ramp_factor falling linearly to 1 (warm-up, compilation).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field


@dataclass
class LoadModel:
    slots: int = 0
    jitter: float = 0.0
    run_jitter: float = 0.0
    ramp_s: float = 0.0
    ramp_factor: float = 1.0
    seed: int = 0

    @property
    def active(self) -> bool:
        return bool(self.slots or self.jitter or self.run_jitter or self.ramp_s)


@dataclass
class LoadState:
    model: LoadModel
    resets: int = 0
    speed: float = 1.0  # the current run's factor (run_jitter)
    t_first: float | None = None  # the first request since the last reset (ramp's origin)
    free_at: list[float] = field(default_factory=list)  # slots' next free times (a heap)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """A prefix-cache reset: a fresh run of the server (new speed, the ramp again)."""
        m = self.model
        rng = random.Random(m.seed * 1_000_003 + self.resets)
        self.resets += 1
        self.speed = max(0.05, 1.0 + rng.gauss(0.0, m.run_jitter)) if m.run_jitter else 1.0
        self.t_first = None
        self.free_at = [0.0] * m.slots if m.slots else []

    def plan(self, index: int | None, t_recv: float, ttft: float, itl: float, chunks: int):
        """(TTFT, chunk gap) for a request received at t_recv (monotonic s)."""
        m = self.model
        if self.t_first is None:
            self.t_first = t_recv
        f = self.speed
        if m.ramp_s > 0 and t_recv - self.t_first < m.ramp_s:
            f *= 1.0 + (m.ramp_factor - 1.0) * (1.0 - (t_recv - self.t_first) / m.ramp_s)
        if m.jitter:
            rng = random.Random((m.seed * 1_000_003 + (index or 0)) * 7919 + 17)
            f *= max(0.05, 1.0 + rng.gauss(0.0, m.jitter))
        ttft, itl = ttft * f, itl * f
        if m.slots:
            start = max(t_recv, heapq.heappop(self.free_at))
            heapq.heappush(self.free_at, start + ttft + itl * max(0, chunks - 1))
            ttft += start - t_recv
        return ttft, itl
