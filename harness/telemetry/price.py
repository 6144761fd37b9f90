"""The price of what serves the run (`--cost-per-hour`), carried as a sampler so that every
command that samples telemetry (bench, sweep, run, locust) records it with the run.

It samples nothing: its summary is the price per hour (one figure, or one per replica,
summed) that `results/efficiency.py` turns into $ per 1M output tokens and per request.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence


def parse_cost_per_hour(text: str) -> list[float]:
    """`--cost-per-hour 2.5` or `2.5,2.5,3.1` (one price per replica) -> [prices]."""
    try:
        prices = [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        prices = []
    if not prices or any(not p >= 0 or p == float("inf") for p in prices):
        raise argparse.ArgumentTypeError(
            f"expected a price per hour such as 2.5, or one per replica such as 2.5,2.5, "
            f"got {text!r}"
        )
    return prices


class PriceSampler:
    name = "price"

    def __init__(self, per_replica: Sequence[float]) -> None:
        assert per_replica and all(p >= 0 for p in per_replica)
        self.per_replica = list(per_replica)

    def start(self, t0_ns: int, sink: Callable[[dict], None]) -> None:
        pass

    def stop(self) -> None:
        pass

    def latest(self) -> dict:
        return {}

    def summary(self) -> dict:
        return {"cost_per_hour": sum(self.per_replica), "per_replica": self.per_replica}
