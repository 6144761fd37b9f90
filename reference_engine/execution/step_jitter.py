"""A server's step-time jitter (host scheduling, GC, an API process on the same cores), as
`calibrate --from-run` measured it: the ratio of each measured one-step decode gap to the
fitted step time, kept as its empirical distribution (QUANTILES quantiles, scaled to mean
1.0 so the means the fit matched stay matched). A hardware spec carrying it (`fit
["step_jitter"]`: only from-run fits do) makes the simulator multiply every step's time by
a draw from it (inverse CDF, linear between the quantiles), from a generator seeded by the
replay's seed: the same seed gives the same run. The workers of one cluster or P/D replay
each draw from a stream of their own (`own_streams`: the seed and the worker's index), as
separate hosts' or processes' jitter is: one shared seed would give every worker the same
sequence of draws, its slow steps at the same step counts."""

from __future__ import annotations

import numpy as np

QUANTILES = 64
MIN_GAPS = 50  # fewer one-step gaps: no distribution is stored
_BLOCK = 4096  # draws made at a time


def fit_jitter(ratios, quantiles: int = QUANTILES) -> dict | None:
    """The stored distribution of measured / predicted step ratios (None: too few)."""
    r = np.asarray([x for x in ratios if np.isfinite(x) and x > 0], dtype=float)
    if len(r) < MIN_GAPS:
        return None
    q = np.quantile(r, np.linspace(0.0, 1.0, quantiles))
    # the mean of the piecewise-linear inverse CDF over uniform draws (trapezoids)
    q = q / float(np.mean((q[1:] + q[:-1]) / 2.0))
    return {"quantiles": [round(float(x), 5) for x in q], "gaps": int(len(r))}


def quantile_of(jitter: dict, p: float) -> float:
    """The distribution's p quantile (0..1)."""
    q = np.asarray(jitter["quantiles"], dtype=float)
    return float(np.interp(p, np.linspace(0.0, 1.0, len(q)), q))


def describe(jitter: dict | None, gaps: int = 0) -> str:
    """The one line calibrate prints."""
    if jitter is None:
        return (f"step jitter: only {gaps} one-step decode gaps (< {MIN_GAPS}): none stored, "
                "simulated steps stay deterministic")  # fmt: skip
    return (f"step jitter from {jitter['gaps']} gaps: p50 x{quantile_of(jitter, 0.5):.2f}, "
            f"p99 x{quantile_of(jitter, 0.99):.2f} (mean x1.00)")  # fmt: skip


def describe_spec(hardware) -> str | None:
    """The line `sim` and `plan` print for a spec carrying a jitter (None: it has none)."""
    j = (getattr(hardware, "fit", None) or {}).get("step_jitter")
    if not j:
        return None
    return (f"step jitter from the fit: each step's time x a seeded draw (p50 "
            f"x{quantile_of(j, 0.5):.2f}, p99 x{quantile_of(j, 0.99):.2f}, mean x1.00; "
            f"from {j.get('gaps', '?')} measured gaps)")  # fmt: skip


class StepJitter:
    """Draws a step's time factor (module doc)."""

    def __init__(self, jitter: dict, seed: int = 0, stream: int = 0) -> None:
        self.q = np.asarray(jitter["quantiles"], dtype=float)
        assert len(self.q) >= 2 and np.all(np.diff(self.q) >= 0), "quantiles must ascend"
        self.p = np.linspace(0.0, 1.0, len(self.q))
        self.jitter, self.seed = jitter, seed
        # stream 0 (a lone engine, a cluster's first worker) keeps the single-engine draws
        key = [int(seed) & 0xFFFFFFFF, 56] + ([int(stream)] if stream else [])
        self.rng = np.random.default_rng(key)
        self._buf: list[float] = []

    @classmethod
    def of(cls, hardware, seed: int = 0) -> StepJitter | None:
        """The spec's jitter (None where it carries none)."""
        j = (getattr(hardware, "fit", None) or {}).get("step_jitter")
        return cls(j, seed) if j else None

    def draw(self) -> float:
        if not self._buf:
            self._buf = np.interp(self.rng.random(_BLOCK), self.p, self.q)[::-1].tolist()
        return self._buf.pop()


def own_streams(engines) -> None:
    """Each simulated worker of a cluster draws its jitter from a stream of its own (its
    index in `engines`), not the seed's one sequence every worker would repeat."""
    for i, e in enumerate(engines):
        j = getattr(e.executor, "jitter", None)
        if j is not None:
            e.executor.jitter = StepJitter(j.jitter, j.seed, stream=i)
