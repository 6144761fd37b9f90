"""A rule's verdict and the gate's result: shared by the bootstrap judge (`judge`) and the
point-estimate judge of aggregate-only imports (`aggregates`)."""

from __future__ import annotations

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
    verdict: str  # "pass" | "noisy" | "fail" | "n/a"
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

    @property
    def passed(self) -> bool:
        return not any(r.failed for r in self.results)


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
