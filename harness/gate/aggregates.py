"""The gate on a run imported aggregate only (`cbbench import` of a summary without
per-request data): each rule is judged on the two point estimates, and every verdict says
that no interval could be computed and why (a bootstrap resamples requests; the file has
none). A statistic the source does not report (a p95 where the tool wrote only p50 and p99)
is `n/a`, never estimated.
"""

from __future__ import annotations

import math

from cbbench.harness.errors import CbbenchError
from cbbench.harness.gate.policy import COST, LATENCY, Policy, Rule
from cbbench.harness.gate.verdict import GateResult, RuleResult, _verdict, zero_baseline
from cbbench.harness.results.comparability import differences, incomparable, summary_line
from cbbench.harness.results.formats.imported import is_aggregate_only
from cbbench.harness.results.run_folder import Run


def _value(run: Run, rule: Rule) -> float | None:
    """The rule's statistic from the run.json summary (aggregate-only imports) or from the
    records' summary (every other run, computed as report computes it)."""
    from cbbench.harness.report.samples import extract
    from cbbench.harness.results.summary import summarize

    if is_aggregate_only(run.meta):
        s = run.meta.get("summary") or {}
    else:
        s = summarize(run.records, extract(run).window_s or None)
    if rule.metric in LATENCY:
        key = "server_queue_s" if rule.metric == "queue" else f"{rule.metric}_s"
        v = (s.get(key) or {}).get(rule.stat)
    elif rule.metric == "error_rate":
        v = s.get("error_rate")
    else:
        v = s.get(rule.metric)
    return None if v is None else float(v)


def why_no_interval(base: Run, cand: Run) -> str:
    which = [n for n, r in (("baseline", base), ("candidate", cand)) if is_aggregate_only(r.meta)]
    tools = {
        str((r.meta.get("imported") or {}).get("tool"))
        for r in (base, cand)
        if is_aggregate_only(r.meta)
    }
    return (
        f"point estimates only: the {' and '.join(which)} {'was' if len(which) == 1 else 'were'} "
        f"imported aggregate only ({', '.join(sorted(tools))}: no per-request records to resample, "
        "so no confidence interval)"
    )


def judge_point(rule: Rule, base: Run, cand: Run, note: str):
    if rule.metric == COST:
        raise CbbenchError("cost_per_1m_tokens: an aggregate-only import has no price")
    b, c = _value(base, rule), _value(cand, rule)
    nan = math.nan
    if b is None or c is None:
        which = "baseline" if b is None else "candidate"
        what = f"{rule.stat} {rule.metric}" if rule.metric in LATENCY else rule.metric
        return RuleResult(
            rule, b, c, nan, nan, nan, nan, "n/a", f"the {which} does not report {what}"
        )
    if rule.relative:
        if b <= 0:
            return zero_baseline(rule, b, c)
        est = c / b
    else:
        est = c
    verdict, bound = _verdict(rule, est, est, est)
    return RuleResult(rule, b, c, est, est, est, bound, verdict, note)


def gate_on_aggregates(base: Run, cand: Run, policy: Policy, allow_incomparable: bool = False):
    for run, which in ((base, "baseline"), (cand, "candidate")):
        if is_aggregate_only(run.meta):
            completed = ((run.meta.get("summary") or {}).get("counts") or {}).get("completed") or 0
        else:
            completed = sum(1 for r in run.records if r.ok and not r.warmup)
        if completed < policy.min_requests:
            raise CbbenchError(
                f"{run.dir}: {which} has {completed} successful requests, "
                f"the policy needs at least {policy.min_requests}"
            )
    found = differences(base.meta, cand.meta)  # the one comparability rule, as for any run
    bad = incomparable(found)
    if bad and not allow_incomparable:
        raise CbbenchError(
            f"not comparable: {summary_line(bad)} (--allow-incomparable judges them anyway)"
        )
    results = [judge_point(rule, base, cand, "no interval") for rule in policy.rules]
    return GateResult(
        results,
        policy,
        str(base.dir),
        str(cand.dir),
        differences=found,
        note=why_no_interval(base, cand),
    )
