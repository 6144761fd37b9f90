"""SLO targets and durations, one grammar for every command (bench, sweep, run, locust, plan).

`--slo METRIC[_STAT]=DURATION,...`: METRIC one of ttft, ttfo, tpot, e2e; STAT one of mean,
p50, p90, p95, p99, max; DURATION always with a unit (200ms, 2s). A bare METRIC (`ttft=500ms`)
is a per-request target: every request within it. `ttft_p99=2s` is a target on the run's p99.
Commands that count goodput (bench, sweep, run, locust) count the requests within every
target's duration; plan judges each target on its statistic (a bare one: the max).
Stdlib only: `--help` of every command imports it.
"""

from __future__ import annotations

import re

from cbbench.harness.durations import parse_seconds
from cbbench.harness.errors import CbbenchError

SLO_KEYS = ("ttft", "ttfo", "tpot", "e2e")


def parse_duration(text: str, what: str) -> float:
    """'200ms' -> 0.2: an SLO target always carries a unit. A bare number is refused, naming
    the two readings it could have (`--slo ttft=200` was once read as 200 seconds, where
    vLLM's `--goodput ttft:200` means 200 ms). The grammar is harness/durations.py's."""
    return parse_seconds(text, what, bare=None)


SLO_STATS = ("mean", "p50", "p90", "p95", "p99", "max")
SLO_GRAMMAR = (
    "METRIC[_STAT]=DURATION, METRIC one of ttft, ttfo, tpot, e2e, STAT one of "
    "mean, p50, p90, p95, p99, max (e.g. ttft=500ms,tpot_p99=50ms)"
)

# --slo's help, the same on every command that counts goodput (bench, sweep, run, locust)
SLO_HELP = (
    "goodput targets, METRIC[_STAT]=DURATION with a unit, e.g. ttft=200ms,tpot=50ms,e2e=10s: "
    "a request within every target counts toward goodput (ttft_p99=2s, plan's spelling, "
    "counts the requests within 2 s the same way; docs/benchmarking.md#slos-and-goodput)"
)


def slo_key(key: str, part: str) -> tuple[str, str | None]:
    """'ttft' -> ('ttft', None): every request within the target; 'ttft_p99' -> ('ttft',
    'p99'): the run's p99 within it. One grammar for bench, sweep, run, locust and plan."""
    m = re.fullmatch(r"(ttft|ttfo|tpot|e2e)(?:_(mean|p50|p90|p95|p99|max))?", key.strip().lower())
    if m is None:
        raise CbbenchError(f"--slo: {part.strip()!r}: expected {SLO_GRAMMAR}")
    return m.group(1), m.group(2)


def parse_slo(text: str | None) -> dict[str, float]:
    """'ttft=200ms,tpot=50ms,e2e=10s' -> {'ttft': 0.2, 'tpot': 0.05, 'e2e': 10.0} (seconds):
    the per-request targets goodput counts. `ttfo` (first answer token) as `ttft`. A target on
    a statistic (`ttft_p99=2s`, plan's spelling) is accepted: goodput counts the requests
    within its duration, as `ttft=2s` does (the run's p99 is in the summary beside it)."""
    if not text:
        return {}
    out: dict[str, float] = {}
    seen: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep and ":" in part:  # vLLM's spelling belongs to --goodput (milliseconds)
            k, _, v = part.partition(":")
            raise CbbenchError(
                f"--slo: {part!r}: write {k.strip()}={v.strip()}ms, or --goodput {part.strip()} "
                "(vLLM's spelling, milliseconds)"
            )
        if not sep:
            raise CbbenchError(f"--slo: {part.strip()!r}: expected {SLO_GRAMMAR}")
        metric, _stat = slo_key(key, part)
        name = key.strip().lower()
        if name in seen:  # which one was meant? (the first used to win silently)
            raise CbbenchError(
                f"--slo: {name} is given twice ({seen[name]}, {part.strip()}): give it once"
            )
        seen[name] = part.strip()
        target = parse_duration(value, f"--slo {key.strip()}")
        out[metric] = min(target, out.get(metric, target))
    return out
