"""Gate policies: which metrics may move how far, read from TOML (`cbbench gate --policy-file`).

```toml
confidence = 0.95      # two-sided bootstrap interval
resamples = 2000       # bootstrap resamples per rule
seed = 0               # the bootstrap is seeded: same inputs, same verdict
min_requests = 20      # fewer successful requests in either run: unusable input (exit 2)

[[rules]]
metric = "ttft"        # ttft ttfo tpot itl e2e queue makespan | output_throughput
                       # request_throughput | error_rate | cost_per_1m_tokens ($ per 1M output
                       # tokens: runs made with --cost-per-hour) (makespan: agent sessions)
                       # session_success (agent graphs: min = 1, every call of every session)
stat = "p99"           # latency metrics: mean or pNN (p50, p90, p99, p99.9, ...)
max_increase = 0.10    # candidate/baseline - 1 must not exceed +10%
# one limit per rule: max_increase | max_decrease (fractions) | max | min (absolute, in
# seconds for latencies, per second for throughputs, a fraction for error_rate)
```
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cbbench.harness.errors import CbbenchError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

LATENCY = ("ttft", "ttfo", "tpot", "itl", "e2e", "queue", "makespan")  # makespan: agent sessions
THROUGHPUT = ("output_throughput", "request_throughput")
COST = "cost_per_1m_tokens"  # price per hour / output throughput, from each run's own price
SESSION_SUCCESS = "session_success"  # agent graphs: the fraction of sessions fully answered
METRICS = (*LATENCY, *THROUGHPUT, "error_rate", COST, SESSION_SUCCESS)
LIMITS = ("max_increase", "max_decrease", "max", "min")
METRIC_TITLES = {
    "ttft": "TTFT",
    "ttfo": "TTFO (first answer token)",
    "tpot": "TPOT",
    "itl": "ITL",
    "e2e": "E2E latency",
    "queue": "queue time",
    "makespan": "agent session makespan",
    "output_throughput": "output tokens/s",
    "request_throughput": "requests/s",
    "error_rate": "error rate",
    COST: "$ per 1M output tokens",
    SESSION_SUCCESS: "agent-graph session success",
}
_STAT = re.compile(r"^(mean|p(\d{1,2}(\.\d+)?))$")


@dataclass(frozen=True)
class Rule:
    metric: str
    limit: str  # one of LIMITS
    value: float
    stat: str = "mean"  # latency metrics only

    @property
    def relative(self) -> bool:
        return self.limit in ("max_increase", "max_decrease")

    @property
    def quantile(self) -> float | None:
        """0..1 for a pNN stat, None for the mean."""
        return None if self.stat == "mean" else float(self.stat[1:]) / 100.0

    @property
    def title(self) -> str:
        what = METRIC_TITLES[self.metric]
        if self.metric in LATENCY:
            what = f"{self.stat} {what}"
        if self.limit == "max_increase":
            return f"{what} must not rise > {self.value:.0%}"
        if self.limit == "max_decrease":
            return f"{what} must not fall > {self.value:.0%}"
        if self.metric == "error_rate" and self.value == 0:
            return f"{what} must stay 0"
        op = "<=" if self.limit == "max" else ">="
        return f"{what} must stay {op} {self.value:g}"


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...]
    confidence: float = 0.95
    resamples: int = 2000
    seed: int = 0
    min_requests: int = 20
    source: str = "default policy"
    notes: tuple[str, ...] = field(default=())


DEFAULT_RULES = (
    Rule("ttft", "max_increase", 0.10, "p50"),
    Rule("ttft", "max_increase", 0.10, "p99"),
    Rule("tpot", "max_increase", 0.10, "p50"),
    Rule("tpot", "max_increase", 0.10, "p99"),
    Rule("e2e", "max_increase", 0.10, "p99"),
    Rule("output_throughput", "max_decrease", 0.05),
    Rule("error_rate", "max", 0.0),
)
DEFAULT_POLICY = Policy(rules=DEFAULT_RULES)


def parse_rule(d: Any, where: str) -> Rule:
    if not isinstance(d, dict):
        raise CbbenchError(f"{where}: a rule must be a table")
    unknown = set(d) - {"metric", "stat", *LIMITS}
    if unknown:
        raise CbbenchError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    metric = d.get("metric")
    if metric not in METRICS:
        raise CbbenchError(f"{where}: metric must be one of {', '.join(METRICS)} (got {metric!r})")
    limits = [k for k in LIMITS if k in d]
    if len(limits) != 1:
        raise CbbenchError(f"{where}: give exactly one of {', '.join(LIMITS)}")
    limit = limits[0]
    value = d[limit]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise CbbenchError(f"{where}: {limit} must be a number >= 0")
    if limit == "max_decrease" and value >= 1:
        raise CbbenchError(f"{where}: max_decrease is a fraction below 1 (0.05 = 5%)")
    if metric == "error_rate" and limit != "max":
        raise CbbenchError(f"{where}: error_rate takes only an absolute `max` (e.g. max = 0)")
    if metric == SESSION_SUCCESS and limit != "min":
        raise CbbenchError(f"{where}: session_success takes only an absolute `min` (e.g. min = 1)")
    stat = d.get("stat", "mean" if metric in LATENCY else None)
    if metric in LATENCY:
        m = _STAT.match(str(stat))
        if not m or (m.group(2) and not 0 < float(m.group(2)) < 100):
            raise CbbenchError(f"{where}: stat must be mean or pNN, e.g. p99 (got {stat!r})")
    elif "stat" in d:
        raise CbbenchError(f"{where}: {metric} takes no stat")
    return Rule(metric=metric, limit=limit, value=float(value), stat=stat or "mean")


def load_policy(path: str | Path) -> Policy:
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CbbenchError(f"{p}: cannot read policy ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise CbbenchError(f"{p}: not valid TOML ({exc})") from None
    unknown = set(data) - {"confidence", "resamples", "seed", "min_requests", "rules"}
    if unknown:
        raise CbbenchError(f"{p}: unknown key(s) {', '.join(sorted(unknown))}")
    raw = data.get("rules")
    if not isinstance(raw, list) or not raw:
        raise CbbenchError(f"{p}: needs at least one [[rules]] table")
    rules = tuple(parse_rule(r, f"{p}: rules[{i}]") for i, r in enumerate(raw))
    conf = data.get("confidence", 0.95)
    if not isinstance(conf, float) or not 0.5 <= conf < 1:
        raise CbbenchError(f"{p}: confidence must be a number in [0.5, 1), e.g. 0.95")
    ints = {}
    for key, default, lo in (("resamples", 2000, 100), ("seed", 0, 0), ("min_requests", 20, 1)):
        v = data.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise CbbenchError(f"{p}: {key} must be an integer >= {lo}")
        ints[key] = v
    return Policy(rules=rules, confidence=conf, source=str(p), **ints)
