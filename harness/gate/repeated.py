"""The gate between two `--repeats` folders: each rule judged on the run means, Welch's
t-interval of their difference (harness/conclusions/repeats.py), so the noise *between runs*
is in the verdict; one run's bootstrap (judge.py) sees only the noise between requests.

Per rule, with the interval of the candidate's change (relative rules: of the ratio - 1):
- fail: the whole interval lies beyond the limit;
- pass: the whole interval lies within it;
- cannot tell: it straddles the limit. The line says whether the interval holds 0 too, i.e.
  whether the two configurations can be told apart at all; more repeats narrow it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from cbbench.harness.conclusions.repeats import (
    REPEATS_FILE,
    compare,
    figure,
    lead_summary,
    t_interval,
)
from cbbench.harness.conclusions.window import run_lead
from cbbench.harness.errors import CbbenchError
from cbbench.harness.gate.policy import LATENCY, Policy, Rule
from cbbench.harness.gate.verdict import GateResult, RuleResult, zero_baseline
from cbbench.harness.results.outcome import incomplete_reason

SUMMARY_KEYS = {"queue": "server_queue_s"}  # a metric whose summary block is named otherwise


def is_repeats(path: str | Path) -> bool:
    return (Path(path) / REPEATS_FILE).exists()


def load_repeats(path: str | Path, allow_incomplete: bool = False) -> list[dict]:
    """The run.json of each repeat, in order (CbbenchError naming the bad one)."""
    d = Path(path)
    try:
        index = json.loads((d / REPEATS_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CbbenchError(f"{d / REPEATS_FILE}: not a valid repeats index ({exc})") from None
    metas = []
    excluded = set(index.get("excluded") or [])  # stopped repeats: on disk, out of the intervals
    for name in index.get("runs", []):
        if name in excluded:
            continue
        run_json = d / str(name) / "run.json"
        try:
            meta = json.loads(run_json.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            raise CbbenchError(f"{run_json}: missing or not valid JSON") from None
        why = incomplete_reason(meta)
        if why and not allow_incomplete:
            raise CbbenchError(f"{run_json.parent}: {why}; rerun it, or pass --allow-incomplete")
        metas.append(meta)
    if len(metas) < 2:
        raise CbbenchError(f"{d}: {len(metas)} repeat(s); an interval needs at least 2")
    return metas


def rule_figure(summary: dict, rule: Rule) -> float | None:
    s = lead_summary(summary)
    if rule.metric in LATENCY:
        return figure(s, (SUMMARY_KEYS.get(rule.metric, f"{rule.metric}_s"), rule.stat))
    return figure(s, (rule.metric,))


def judge_repeated(rule: Rule, base: list[dict], cand: list[dict], policy: Policy) -> RuleResult:
    a = [rule_figure(m.get("summary") or {}, rule) for m in base]
    b = [rule_figure(m.get("summary") or {}, rule) for m in cand]
    a = [x for x in a if x is not None]
    b = [x for x in b if x is not None]
    nan = math.nan
    if len(a) < 2 or len(b) < 2:
        return RuleResult(rule, None, None, nan, nan, nan, nan, "n/a", "too few runs report it")
    d = compare(a, b, rule.metric, policy.confidence)
    assert d is not None
    if rule.relative and d.a_mean <= 0:
        return zero_baseline(rule, d.a_mean, d.b_mean)
    if rule.relative:
        est, low, high = d.ratio, 1 + d.low, 1 + d.high
        bound = 1 + rule.value if rule.limit == "max_increase" else 1 - rule.value
    else:  # an absolute limit: the candidate's own t-interval
        iv = t_interval(b, policy.confidence)
        assert iv is not None
        est, low, high, bound = iv.mean, iv.low, iv.high, rule.value
    upper = rule.limit in ("max_increase", "max")
    beyond_all = low > bound if upper else high < bound
    within_all = high <= bound if upper else low >= bound
    verdict = "fail" if beyond_all else "pass" if within_all else "cannot tell"
    apart = "can be told apart" if d.verdict != "cannot tell" else "cannot be told apart"
    note = f"{len(a)} vs {len(b)} runs; the two {apart} (difference {d.low:+.1%} to {d.high:+.1%})"
    return RuleResult(rule, d.a_mean, d.b_mean, est, low, high, bound, verdict, note)


def run_repeated_gate(
    base_dir: str,
    cand_dir: str,
    policy: Policy,
    allow_incomplete: bool = False,
    allow_incomparable: bool = False,
) -> GateResult:
    """Each rule on the run means. The repeats are compared as single runs are (the first
    of each: a --repeats folder repeats one configuration): incomparable ones are refused
    unless `allow_incomparable`, what to read with care is kept for the caller to print."""
    from cbbench.harness.gate.client_notes import repeats_client_notes
    from cbbench.harness.results.comparability import (
        differences,
        incomparable,
        summary_line,
        untold,
    )

    base, cand = load_repeats(base_dir, allow_incomplete), load_repeats(cand_dir, allow_incomplete)
    found = differences(base[0], cand[0])
    bad = incomparable(found)
    if bad and not allow_incomparable:
        raise CbbenchError(
            f"not comparable: {summary_line(bad)} (--allow-incomparable judges them anyway)"
        )
    kinds = {str(run_lead(m)) for m in base + cand}
    if len(kinds) > 1:
        raise CbbenchError(
            f"the repeats led with different windows ({', '.join(sorted(kinds))}): rerun them "
            "with one --window so the gate compares the same kind"
        )
    results = [judge_repeated(r, base, cand, policy) for r in policy.rules]
    method = "Welch t-interval over run means"
    unsaid = untold(base[0], cand[0])
    notes = [f"read with care: {unsaid}"] if unsaid else []
    notes += repeats_client_notes("baseline", base) + repeats_client_notes("candidate", cand)
    return GateResult(results, policy, base_dir, cand_dir, found, notes=notes, method=method)
