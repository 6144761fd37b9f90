"""Durations, one rule for every harness flag: a number with a unit (`250ms`, `1.5s`, `2m`,
`50us`), or a bare number meaning seconds (`--duration 10` is 10 s, `--timeout 600`).

Two places read a bare number otherwise, each said where it is parsed: an SLO target
(`--slo ttft=200`) refuses it, since vLLM's `--goodput ttft:200` means 200 ms there and a
guess either way is a silent factor of 1000; `--goodput KEY:N` reads it as milliseconds,
as vLLM does. The engine's flags (`serve --max-queue-delay`, `--drain-timeout`, the router's)
take the same grammar in `reference_engine/config/options.py::seconds_arg` (the engine stands
alone, so it keeps its own copy; tests/test_durations.py holds the two to the same answers).
Stdlib only: every command's `--help` imports it.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable

from cbbench.harness.errors import CbbenchError

UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}
_PATTERN = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(us|ms|s|m)?\s*")
EXAMPLE = "e.g. 250ms, 1.5s, 2m, or a bare number of seconds"


def parse_seconds(text: str, what: str, *, bare: str | None = "s") -> float:
    """'250ms' -> 0.25, '10' -> 10.0 (seconds). `bare` is the unit of a number written
    without one (None: refused, naming the readings it could have). `what` names the flag."""
    m = _PATTERN.fullmatch(str(text))
    if not m:
        raise CbbenchError(f"{what}: {str(text).strip()!r} is not a duration ({EXAMPLE})")
    number, unit = m.group(1), m.group(2)
    if unit is None and bare is None:
        raise CbbenchError(
            f"{what}: {str(text).strip()!r} has no unit: write {number}ms or {number}s"
        )
    return float(number) * UNITS[unit or bare]


def duration_arg(
    lo: float | None = None, hi: float | None = None, *, positive: bool = False
) -> Callable[[str], float]:
    """An argparse `type=` for a duration flag (seconds), with optional bounds in seconds.
    argparse names the flag in its one-line error (`argument --duration: ...`)."""

    def parse(text: str) -> float:
        try:
            value = parse_seconds(text, "value")
        except CbbenchError:
            raise argparse.ArgumentTypeError(
                f"{text.strip()!r} is not a duration ({EXAMPLE})"
            ) from None
        if positive and value <= 0:
            raise argparse.ArgumentTypeError(f"must be longer than 0, got {text.strip()!r}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(
                f"expected a duration between {_show(lo)} and {_show(hi)}, got {text.strip()!r}"
            )
        return value

    parse.__name__ = "duration"  # argparse's "invalid duration value" when a type error escapes
    return parse


def _show(seconds: float | None) -> str:
    if seconds is None:
        return "any"
    return f"{seconds * 1e3:g}ms" if seconds < 1 else f"{seconds:g}s"


seconds_arg = duration_arg()
