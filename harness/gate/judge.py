"""Regression gate: judge each policy rule with a bootstrap confidence interval.

The bootstrap resamples *requests* (seeded, vectorised: one row of drawn request indices per
resample, in chunks); ITL gaps are weighted by how often their request was drawn, so the
gaps of a request move together.
- Latency stats: the ratio candidate/baseline of the weighted statistic (mean, or the
  percentile by numpy's default linear interpolation, the one method `bench`, `report` and
  the live view use: workloads/stats.py), each run resampled independently.
- Throughput: per-request contributions through Little's law. A run's throughput is
  Σtokens / W = L · Σtokens / Σe2e with L = Σe2e / W its mean number of requests in flight;
  a resample keeps L and re-draws the requests, so the interval carries the spread of
  per-request token counts and latencies (exact for a closed loop, wider than needed for
  an open loop whose rate is set by the schedule). When a run has no per-request e2e the
  run-level number is used as it is (a zero-width interval).
- Error rate: the resampled fraction of failed requests; `max = 0` is judged on the
  observed count instead (any failed request fails the rule).
A rule fails only when the whole interval lies beyond its limit; when only the point
estimate does, it is reported as `noisy` and passes.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from cbbench.harness.errors import CbbenchError
from cbbench.harness.gate.aggregates import gate_on_aggregates
from cbbench.harness.gate.client_notes import client_notes
from cbbench.harness.gate.policy import COST, LATENCY, SESSION_SUCCESS, Policy, Rule
from cbbench.harness.gate.verdict import (
    GateResult,
    RuleResult,
    _verdict,
    inconclusive,
    zero_baseline,
)
from cbbench.harness.report.samples import RunSamples
from cbbench.harness.results.comparability import (
    differences,
    incomparable,
    summary_line,
    untold,
)
from cbbench.harness.results.formats.imported import is_aggregate_only
from cbbench.harness.results.integrity import damage
from cbbench.harness.results.outcome import incomplete_reason
from cbbench.harness.results.run_folder import Run

CHUNK_ELEMENTS = 4_000_000  # bounds the (resamples x values) weight matrix in memory


class _Sample:
    """Values sorted once, with the request each belongs to (None: one value per request)."""

    def __init__(self, values: np.ndarray, owner: np.ndarray | None, n_owners: int) -> None:
        keep = ~np.isnan(values)
        order = np.argsort(values[keep], kind="stable")
        self.values = values[keep][order]
        self.owner = None if owner is None else owner[keep][order]
        self.n = self.values.size if owner is None else n_owners  # what a resample draws

    def point(self, q: float | None) -> float:
        if self.owner is not None:
            return float(self._weighted(q, np.ones((1, self.n)))[0])
        return float(self.values.mean() if q is None else np.percentile(self.values, q * 100))

    def _rank(self, q: float) -> tuple[int, float]:
        """The linear q-quantile of m sorted values (numpy's default): between positions
        lo and lo + 1 at fraction frac."""
        h = (self.values.size - 1) * q
        lo = min(int(math.floor(h + 1e-12)), self.values.size - 1)
        return lo, max(0.0, h - lo)

    def draws(self, q: float | None, rng: np.random.Generator, resamples: int) -> np.ndarray:
        """The statistic on `resamples` bootstrap resamples of the requests."""
        m = self.values.size
        if self.owner is None and q is not None:
            # The k-th smallest (0-based) of m uniform draws from the m sorted values is the
            # value at floor(m * U_(k)), U_(k) ~ Beta(k+1, m-k); the next one, given U_(k) = u,
            # is the least of the other m-k-1 draws on (u, 1): u + (1-u) Beta(1, m-k-1).
            # Exact, and O(resamples), not O(m) each.
            k, frac = self._rank(q)
            u = rng.beta(k + 1, m - k, size=resamples)
            low = self.values[np.minimum(np.floor(u * m).astype(np.int64), m - 1)]
            if frac == 0.0 or k + 1 >= m:
                return low
            u_next = u + (1.0 - u) * rng.beta(1, m - k - 1, size=resamples)
            high = self.values[np.minimum(np.floor(u_next * m).astype(np.int64), m - 1)]
            return low + frac * (high - low)
        if self.owner is None:
            return _boot(rng, m, resamples, m, lambda p: self.values[p].mean(axis=1))

        def weighted(picks: np.ndarray) -> np.ndarray:
            rows = picks.shape[0]
            flat = (picks + (np.arange(rows) * self.n)[:, None]).ravel()
            counts = np.bincount(flat, minlength=rows * self.n).reshape(rows, self.n)
            return self._weighted(q, counts)

        return _boot(rng, self.n, resamples, m, weighted)

    def _weighted(self, q: float | None, counts: np.ndarray) -> np.ndarray:
        """Grouped values (ITL gaps): each weighted by how often its request was drawn."""
        w = counts[:, self.owner].astype(np.float64)
        total = w.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            if q is None:
                return (w @ self.values) / total
            # the linear q-quantile of the values repeated by their weights: positions lo and
            # lo + 1 of that expanded sorted list are values #{cw <= lo} and #{cw <= lo + 1}
            cw = np.cumsum(w, axis=1)
            h = np.maximum(total - 1, 0) * q
            lo = np.floor(h + 1e-9)
            frac = np.maximum(h - lo, 0.0)
            top = self.values.size - 1
            i_lo = np.minimum((cw <= lo[:, None] + 1e-9).sum(axis=1), top)
            i_hi = np.minimum((cw <= lo[:, None] + 1 + 1e-9).sum(axis=1), top)
        low, high = self.values[i_lo], self.values[i_hi]
        out = np.where(frac > 0, low + frac * (high - low), low)
        return np.where(total > 0, out, np.nan)


def _boot(rng: np.random.Generator, n: int, resamples: int, width: int, fn) -> np.ndarray:
    """fn(picks: rows x n request indices drawn with replacement) -> rows, in chunks."""
    rows = max(1, CHUNK_ELEMENTS // max(1, width, n))
    return np.concatenate(
        [
            fn(rng.integers(0, n, size=(min(rows, resamples - i), n)))
            for i in range(0, resamples, rows)
        ]
    )


def _latency_sample(s: RunSamples, metric: str) -> _Sample:
    if metric == "itl":
        return _Sample(s.itl, s.itl_owner, s.n_ok)
    if metric == "makespan":  # one value per finished agent session
        return _Sample(s.makespan, None, s.makespan.size)
    return _Sample(s.latency(metric), None, s.n_ok)


def _throughput_boot(s: RunSamples, metric: str, rng, resamples: int) -> tuple[float, np.ndarray]:
    point = s.output_throughput if metric == "output_throughput" else s.request_throughput
    assert point is not None
    e2e = np.nan_to_num(s.e2e, nan=0.0)
    if e2e.sum() <= 0:
        return point, np.full(resamples, point)
    in_flight = e2e.sum() / s.window_s
    per_req = s.output_tokens if metric == "output_throughput" else np.ones(s.n_ok)
    return point, _boot(
        rng,
        s.n_ok,
        resamples,
        s.n_ok,
        lambda p: in_flight * per_req[p].sum(axis=1) / e2e[p].sum(axis=1),
    )


def _cost_boot(s: RunSamples, which: str, rng, resamples: int) -> tuple[float, np.ndarray]:
    """$ per 1M output tokens = price per hour / 3600 / output tokens per s x 1e6, drawn from
    the output throughput's bootstrap."""
    if s.cost_per_hour is None:
        raise CbbenchError(
            f"cost_per_1m_tokens: the {which} run has no price (run it with --cost-per-hour)"
        )
    point, draws = _throughput_boot(s, "output_throughput", rng, resamples)
    scale = s.cost_per_hour / 3600.0 * 1e6
    with np.errstate(divide="ignore"):
        return (scale / point if point else math.inf), scale / draws


def _interval(draws: np.ndarray, confidence: float) -> tuple[float, float]:
    draws = draws[np.isfinite(draws)]
    if draws.size == 0:
        return math.nan, math.nan
    a = (1.0 - confidence) / 2.0 * 100.0
    lo, hi = np.percentile(draws, [a, 100.0 - a])
    return float(lo), float(hi)


def _session_success(
    rule: Rule, base: RunSamples, cand: RunSamples, rng, n: int, confidence: float
) -> RuleResult:
    """The fraction of agent-graph sessions that answered every call, against a `min`."""
    ok = cand.session_ok
    if ok.size == 0:
        if base.session_ok.size == 0:
            nan = math.nan
            return RuleResult(
                rule, None, None, nan, nan, nan, nan, "n/a", "no agent-graph sessions"
            )
        raise CbbenchError("session_success: the candidate run has no agent-graph sessions")
    est = float(ok.mean())
    b = float(base.session_ok.mean()) if base.session_ok.size else None
    failed = int(ok.size - ok.sum())
    note = f"{failed} of {ok.size} sessions failed"
    if rule.value >= 1:
        return RuleResult(rule, b, est, est, est, est, 1.0, "fail" if failed else "pass", note)
    draws = _boot(rng, ok.size, n, ok.size, lambda p: ok[p].mean(axis=1))
    low, high = _interval(draws, confidence)
    verdict, bound = _verdict(rule, est, low, high)
    return RuleResult(rule, b, est, est, low, high, bound, verdict, note)


def judge(rule: Rule, base: RunSamples, cand: RunSamples, policy: Policy) -> RuleResult:
    rng = np.random.default_rng(policy.seed)
    n = policy.resamples
    if rule.metric == "error_rate":
        errs = np.r_[np.ones(cand.n_errors), np.zeros(cand.n_total - cand.n_errors)]
        est = cand.error_rate
        if rule.value == 0:
            verdict = "fail" if cand.n_errors else "pass"
            note = f"{cand.n_errors} of {cand.n_total} requests failed"
            return RuleResult(rule, base.error_rate, est, est, est, est, 0.0, verdict, note)
        draws = _boot(rng, errs.size, n, errs.size, lambda p: errs[p].mean(axis=1))
        low, high = _interval(draws, policy.confidence)
        verdict, bound = _verdict(rule, est, low, high)
        verdict, note = inconclusive(rule, est, low, high, verdict, cand.n_total)
        return RuleResult(rule, base.error_rate, est, est, low, high, bound, verdict, note)
    if rule.metric == SESSION_SUCCESS:
        return _session_success(rule, base, cand, rng, n, policy.confidence)
    if rule.metric == "ttfo" and not (base.reasoning_tokens or cand.reasoning_tokens):
        note = "neither run reasoned: TTFO is TTFT"
        nan = math.nan
        return RuleResult(rule, None, None, nan, nan, nan, nan, "n/a", note)
    if rule.metric in LATENCY:
        bs, cs = _latency_sample(base, rule.metric), _latency_sample(cand, rule.metric)
        if bs.values.size == 0 and cs.values.size == 0:
            return RuleResult(
                rule,
                None,
                None,
                math.nan,
                math.nan,
                math.nan,
                math.nan,
                "n/a",
                "neither run reports it",
            )
        if bs.values.size == 0 or cs.values.size == 0:
            which = "baseline" if bs.values.size == 0 else "candidate"
            raise CbbenchError(f"{rule.metric}: the {which} run has no values to compare")
        q = rule.quantile
        b_point, c_point = bs.point(q), cs.point(q)
        b_draws, c_draws = bs.draws(q, rng, n), cs.draws(q, rng, n)
    elif rule.metric in ("output_throughput", COST) and not (
        base.output_tokens.sum() or cand.output_tokens.sum()
    ):
        nan = math.nan
        note = "does not apply: no tokens generated (embeddings)"
        return RuleResult(rule, None, None, nan, nan, nan, nan, "n/a", note)
    elif rule.metric == COST:
        b_point, b_draws = _cost_boot(base, "baseline", rng, n)
        c_point, c_draws = _cost_boot(cand, "candidate", rng, n)
    else:
        b_point, b_draws = _throughput_boot(base, rule.metric, rng, n)
        c_point, c_draws = _throughput_boot(cand, rule.metric, rng, n)
    if rule.relative:
        if b_point <= 0:
            return zero_baseline(rule, b_point, c_point)
        with np.errstate(invalid="ignore", divide="ignore"):
            draws = c_draws / b_draws
        est = c_point / b_point
    else:
        draws, est = c_draws, c_point
    low, high = _interval(draws, policy.confidence)
    verdict, bound = _verdict(rule, est, low, high)
    if rule.metric in LATENCY:
        size = min(bs.values.size, cs.values.size)
    else:
        size = min(base.n_total, cand.n_total)
    verdict, note = inconclusive(rule, est, low, high, verdict, size)
    return RuleResult(rule, b_point, c_point, est, low, high, bound, verdict, note)


def check_inputs(
    base: Run,
    cand: Run,
    bs: RunSamples,
    cs: RunSamples,
    policy: Policy,
    allow_incomplete: bool = False,
    allow_incomparable: bool = False,
) -> None:
    """Unusable or mismatched inputs: one clear error (exit 2)."""
    for run, s, which in ((base, bs, "baseline"), (cand, cs, "candidate")):
        hurt = damage(run)
        reason = incomplete_reason(run.meta) or (hurt and f"is damaged: {hurt}")
        if reason and not allow_incomplete:
            raise CbbenchError(
                f"{run.dir}: the {which} {reason}; rerun it, or pass --allow-incomplete"
            )
        if s.n_ok < policy.min_requests:
            raise CbbenchError(
                f"{run.dir}: {which} has {s.n_ok} successful requests, "
                f"the policy needs at least {policy.min_requests}"
            )
        if s.window_s <= 0:
            raise CbbenchError(f"{run.dir}: {which} has no request timings (sent_s/last_token_s)")
    diffs = incomparable(differences(base.meta, cand.meta))
    if diffs and not allow_incomparable:
        raise CbbenchError(
            f"not comparable: {summary_line(diffs)} (--allow-incomparable judges them anyway)"
        )


def with_ttfo(rules: tuple[Rule, ...], bs: RunSamples, cs: RunSamples) -> tuple[Rule, ...]:
    """TTFO gated like TTFT: when a run reasoned and the policy names no TTFO rule, each TTFT
    rule gets its TTFO twin (the answer's wait, which reasoning can move while TTFT holds)."""
    if not (bs.reasoning_tokens or cs.reasoning_tokens) or any(r.metric == "ttfo" for r in rules):
        return rules
    twins = tuple(replace(r, metric="ttfo") for r in rules if r.metric == "ttft")
    return (*rules, *twins)


def run_gate(
    base: Run,
    cand: Run,
    policy: Policy,
    allow_incomplete: bool = False,
    allow_incomparable: bool = False,
    window: str | None = None,
) -> GateResult:
    """`allow_incomplete`: judge killed or interrupted runs too (on the requests they hold);
    `allow_incomparable`: judge runs that differ in endpoint, load shape, workload or model
    (results/comparability.py), which otherwise is an error. `window`: steady, all or
    START:END for both runs; None: what both runs led with (the same kind on both sides,
    harness/conclusions/window.py)."""
    from cbbench.harness.conclusions.window import same_kind, windowed_run
    from cbbench.harness.report.samples import extract

    if is_aggregate_only(base.meta) or is_aggregate_only(cand.meta):
        if not allow_incomplete:
            for run, which in ((base, "baseline"), (cand, "candidate")):
                reason = incomplete_reason(run.meta)
                if reason:
                    raise CbbenchError(
                        f"{run.dir}: the {which} {reason}; rerun it, or pass --allow-incomplete"
                    )
        return gate_on_aggregates(base, cand, policy, allow_incomparable)
    bs, cs = extract(base), extract(cand)  # the whole runs are checked, then windowed
    check_inputs(base, cand, bs, cs, policy, allow_incomplete, allow_incomparable)
    whole = (bs, cs)  # errors count wherever they happened: ramp-up and drain too
    spec, note = same_kind(base.meta, cand.meta, window)
    notes = [note] if note else []
    if spec != "all":
        wb, w1 = windowed_run(base, spec)
        wc, w2 = windowed_run(cand, spec)
        small = min(sum(r.ok for r in x.records if not r.warmup) for x in (wb, wc))
        if w1 is None or w2 is None or small < policy.min_requests:
            notes.append(f"no {spec} window in both runs with {policy.min_requests} requests: "
                         "compared the whole runs")  # fmt: skip
        else:
            base, cand = wb, wc
            bs, cs = extract(base), extract(cand)
            notes.append(f"compared {w1.label()} (baseline) with {w2.label()} (candidate)")
    results = [
        judge(rule, *(whole if rule.metric == "error_rate" else (bs, cs)), policy)
        for rule in with_ttfo(policy.rules, bs, cs)
    ]
    if unsaid := untold(base.meta, cand.meta):
        notes.append(f"read with care: {unsaid}")
    notes += client_notes([("baseline", base.meta), ("candidate", cand.meta)])
    return GateResult(
        results, policy, str(base.dir), str(cand.dir), differences(base.meta, cand.meta),
        notes=notes,
    )  # fmt: skip
