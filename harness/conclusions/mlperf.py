"""MLPerf Inference's server scenario as a verdict on a run: VALID or INVALID, with the reason.

Source: mlcommons/inference_policies `inference_rules.adoc` (commit ac93e89, July 2026:
Scenarios table, the per-model TTFT/TPOT limits, appendix "Early Stopping Criterion") and
LoadGen's `mlperf.conf` / `results.cc` (mlcommons/inference): queries arrive as a Poisson
process; the run lasts at least 600 s (`min_duration`, by the last query's *scheduled* time)
and issues at least `min_query_count` queries (LoadGen's default, 100); a query's TTFT counts
from its scheduled time; the 99th percentiles (LoadGen's rank: sorted[int(n x 0.99)]) of
TTFT and TPOT must be within the model's limits; and the early stopping criterion must hold
for each (confidence 0.99, tolerance 0): with t queries over a limit, the run needs at least
h + t queries, h the least count with I(0.99; h, t + 1) <= 0.01.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from cbbench.harness.conclusions.stats import betainc
from cbbench.harness.errors import CbbenchError
from cbbench.harness.results.records import RequestRecord

RULES_VERSION = "inference_rules.adoc @ mlcommons/inference_policies ac93e89 (2026-07-23)"
MIN_DURATION_S = 600.0
MIN_QUERY_COUNT = 100
PERCENTILE = 0.99
CONFIDENCE = 0.99
TOLERANCE = 0.0
EXIT_INVALID = 5  # `bench --scenario`: the run finished and the verdict is INVALID
SCENARIOS = ("mlperf-server", "mlperf-interactive")

# (TTFT limit s, TPOT limit s): server ("conversational") and interactive, per model class
LIMITS: dict[str, dict[str, tuple[float, float]]] = {
    "llama3.1-8b": {"server": (2.0, 0.100), "interactive": (0.500, 0.030)},
    "llama2-70b": {"server": (2.0, 0.200), "interactive": (0.450, 0.040)},
    "llama3.1-405b": {"server": (6.0, 0.175), "interactive": (4.5, 0.080)},
    "mixtral-8x7b": {"server": (2.0, 0.200)},
    "deepseek-r1": {"server": (2.0, 0.080), "interactive": (1.5, 0.015)},
    "gpt-oss-120b": {"server": (3.0, 0.080), "interactive": (2.0, 0.020)},
}


def limits(model_class: str, scenario: str) -> tuple[float, float]:
    variant = "interactive" if scenario == "mlperf-interactive" else "server"
    if scenario not in SCENARIOS:
        raise CbbenchError(f"--scenario {scenario!r}: one of {', '.join(SCENARIOS)}")
    if model_class not in LIMITS:
        raise CbbenchError(
            f"--model-class {model_class!r}: one of {', '.join(LIMITS)} (MLPerf's classes)"
        )
    if variant not in LIMITS[model_class]:
        raise CbbenchError(f"--model-class {model_class}: MLPerf defines no interactive limits")
    return LIMITS[model_class][variant]


def min_passing(t: int, p: float = PERCENTILE, d: float = TOLERANCE, c: float = CONFIDENCE) -> int:
    """The least h (under-latency queries) with I(p - d; h, t + 1) <= 1 - c."""
    x = p - d
    if betainc(1, t + 1, x) <= 1 - c:
        return 1
    lo, hi = 1, 2
    while betainc(hi, t + 1, x) > 1 - c:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if betainc(mid, t + 1, x) <= 1 - c:
            hi = mid
        else:
            lo = mid
    return hi


def rank_percentile(values: list[float], p: float = PERCENTILE) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p))]


@dataclass
class Check:
    metric: str  # "TTFT" | "TPOT"
    limit_s: float
    p99_s: float | None
    over: int  # queries over the limit
    needed: int  # queries early stopping needs, given `over`
    early_stopping_ok: bool
    estimate_s: float | None  # the early-stopping p99 estimate (None: too few queries)


@dataclass
class Verdict:
    valid: bool
    scenario: str
    model_class: str
    queries: int
    duration_s: float  # the last query's scheduled time
    min_duration_s: float
    compliant_length: bool  # min_duration_s >= the rules' 600 s
    checks: list[Check] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    rules: str = RULES_VERSION

    def to_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        head = "VALID" if self.valid else "INVALID"
        out = [f"MLPerf {self.scenario} ({self.model_class}): {head}"]
        for c in self.checks:
            est = "-" if c.estimate_s is None else f"{c.estimate_s * 1e3:.1f} ms"
            p99 = "-" if c.p99_s is None else f"{c.p99_s * 1e3:.1f} ms"
            out.append(
                f"  {c.metric} p99 {p99} (limit {c.limit_s * 1e3:.0f} ms); {c.over} of "
                f"{self.queries} over; early stopping needs {c.needed} queries: "
                f"{'met' if c.early_stopping_ok else 'NOT met'}; early-stopping p99 estimate {est}"
            )
        out += [f"  reason: {r}" for r in self.reasons]
        if not self.compliant_length:
            out.append(
                f"  length NOT COMPLIANT: --min-duration {self.min_duration_s:g} s, the rules "
                f"require {MIN_DURATION_S:g} s (a shortened run, not a result)"
            )
        out.append(f"  rules: {self.rules}")
        return out


def _check(metric: str, values: list[float], limit: float, queries: int) -> Check:
    over = sum(v > limit for v in values)
    needed = min_passing(over) + over
    est = None
    for t in range(1, queries + 1):  # LoadGen's single-stream loop: the most it may discard
        if queries < min_passing(t) + t:
            est = sorted(values)[max(0, len(values) - t)] if values and t > 1 else None
            break
    return Check(metric, limit, rank_percentile(values), over, needed, queries >= needed, est)


def judge(
    records: list[RequestRecord], scenario: str, model_class: str, min_duration_s: float
) -> Verdict:
    ttft_limit, tpot_limit = limits(model_class, scenario)
    measured = [r for r in records if not r.warmup]
    queries = len(measured)
    ok = [r for r in measured if r.ok]
    ttft = [
        (r.first_token_s - r.scheduled_s)
        if r.first_token_s is not None and r.scheduled_s is not None
        else r.ttft_s
        for r in ok
    ]
    ttft = [v for v in ttft if v is not None]
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    sched = [r.scheduled_s if r.scheduled_s is not None else r.sent_s for r in measured]
    duration = max((s for s in sched if s is not None), default=0.0)
    v = Verdict(
        True, scenario, model_class, queries, duration, min_duration_s,
        min_duration_s >= MIN_DURATION_S,
    )  # fmt: skip
    v.checks = [
        _check("TTFT", ttft, ttft_limit, queries),
        _check("TPOT", tpot, tpot_limit, queries),
    ]
    failed = len(measured) - len(ok)
    if failed:
        v.reasons.append(f"{failed} of {queries} queries failed")
    for c in v.checks:
        if c.p99_s is None:
            v.reasons.append(f"no {c.metric} values")
        elif c.p99_s > c.limit_s:
            v.reasons.append(
                f"{c.metric} p99 {c.p99_s * 1e3:.1f} ms over the {c.limit_s * 1e3:.0f} ms limit"
            )
        if not c.early_stopping_ok:
            v.reasons.append(
                f"early stopping ({c.metric}): {c.over} of {queries} queries over "
                f"{c.limit_s * 1e3:.0f} ms; at {PERCENTILE:.0%} with {CONFIDENCE:.0%} confidence "
                f"the run needs {c.needed} queries, {c.needed - queries} more, every one under "
                "the limit"
            )
    if duration < min_duration_s:
        v.reasons.append(
            f"min duration not met: last query at {duration:.1f} s < {min_duration_s:g} s"
        )
    if queries < MIN_QUERY_COUNT:
        v.reasons.append(f"min query count not met: {queries} < {MIN_QUERY_COUNT}")
    v.valid = not v.reasons
    return v


def plan_queries(rate: float, min_duration_s: float) -> int:
    """Queries to draw so that a Poisson schedule at `rate` outlasts min_duration_s (the
    schedule is then cut after the first arrival past it)."""
    if not (rate > 0 and math.isfinite(rate)):
        raise CbbenchError("--scenario mlperf-*: give --rate (the Poisson parameter, req/s)")
    mean = rate * min_duration_s
    return max(MIN_QUERY_COUNT, int(mean + 6 * math.sqrt(mean) + 10))
