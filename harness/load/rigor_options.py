"""The run-level rigor flags, declared once (docs/rigor.md): `--window`, `--on-saturation`,
`--repeats`, `--scenario`, `--model-class`, `--min-duration`. Light to import: `--help`
stays fast."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from cbbench.harness.conclusions.mlperf import LIMITS, SCENARIOS  # stdlib only: --help stays fast

MODEL_CLASSES = tuple(LIMITS)


@dataclass
class RigorOptions:
    window: str = "steady"  # steady | all | START:END
    on_saturation: str = "stop"  # stop | continue
    repeats: int = 1
    scenario: str | None = None
    model_class: str | None = None
    min_duration: str | None = None  # "600s" by default for the scenario

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> RigorOptions:
        return cls(
            window=getattr(ns, "window", None) or "steady",
            on_saturation=getattr(ns, "on_saturation", None) or "stop",
            repeats=getattr(ns, "repeats", None) or 1,
            scenario=getattr(ns, "scenario", None),
            model_class=getattr(ns, "model_class", None),
            min_duration=getattr(ns, "min_duration", None),
        )


def add_window_arg(p: argparse.ArgumentParser, default: str | None = "steady") -> None:
    p.add_argument(
        "--window",
        default=default,
        metavar="steady|all|START:END",
        help="the figures the summary leads with: the steady-state window (ramp-up and drain "
        "excluded, docs/rigor.md), the whole run, or seconds START:END from t0"
        + (f" (default: {default})" if default else " (default: what the runs led with)"),
    )


def add_rigor_args(p: argparse.ArgumentParser) -> None:
    add_window_arg(p)
    p.add_argument(
        "--on-saturation",
        choices=("stop", "continue"),
        default="stop",
        help="an open-loop run whose queue grows without bound: stop it (exit 4, finished "
        "requests kept) or run on and say so (default: stop)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        metavar="N",
        default=1,
        help="run the workload N times into one folder (prefix cache reset before each where "
        "the server allows); each figure's mean, 95%% t-interval and CV (default: 1)",
    )
    p.add_argument(
        "--scenario",
        choices=SCENARIOS,
        help="MLPerf Inference's server scenario (or its interactive variant): Poisson "
        "arrivals at --rate, >= 600 s and 100 queries, p99 TTFT/TPOT limits of --model-class, "
        "early stopping; prints VALID or INVALID with the reason",
    )
    p.add_argument(
        "--model-class",
        choices=MODEL_CLASSES,
        help="--scenario: the MLPerf model whose TTFT/TPOT limits apply",
    )
    p.add_argument(
        "--min-duration",
        metavar="DURATION",
        help="--scenario: shorten the run (e.g. 20s) for tests; the verdict then says the "
        "length is not compliant (default: 600s, the rules')",
    )
