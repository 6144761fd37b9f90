"""`cbbench diagnose`: from a run's numbers to answers. Rules over a run folder's records and
telemetry; each finding carries its evidence and the fix in each engine's own flags.

    from cbbench.harness.diagnose import diagnose_run
    for f in diagnose_run(load_run("results/runs/x")):
        print(f.title, f.evidence, f.fixes["vllm"])

Layer: diagnose (run folders -> findings).
Imports: results.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cbbench.harness.diagnose.base import ENGINES, Finding, Rule, RunView
from cbbench.harness.diagnose.rules import RULES
from cbbench.harness.results.run_folder import Run


@dataclass
class Diagnosis:
    run: Run
    label: str
    engine: str | None
    scheduler: str | None
    findings: list[Finding]
    requests: int  # successful measured requests the rules looked at
    vitals: dict = field(default_factory=dict)  # the numbers to look at first
    failed: int = 0  # measured requests that failed (not among `requests`)
    partial: list[str] = field(default_factory=list)  # killed, interrupted or damaged

    def to_dict(self) -> dict:
        return {
            "run": str(self.run.dir),
            "label": self.label,
            "engine": self.engine,
            "scheduler": self.scheduler,
            "requests": self.requests,
            "failed": self.failed,
            "partial": self.partial,
            "vitals": self.vitals,
            "findings": [f.to_dict() for f in self.findings],
        }


def diagnose_run(run: Run, label: str | None = None, rules: tuple[Rule, ...] = RULES) -> Diagnosis:
    view = RunView(run)
    findings = []
    for rule in rules:
        f = rule.check(view)
        if f is not None:
            assert f.rule == rule.id, f"rule {rule.id} returned a finding for {f.rule}"
            findings.append(f)
    from cbbench.harness.diagnose.vitals import vitals
    from cbbench.harness.results.formats.imported import is_aggregate_only
    from cbbench.harness.results.integrity import trust_problems

    failed = len(view.measured) - len(view.ok)
    problems = trust_problems(run)
    if is_aggregate_only(run.meta):  # nothing for a rule to read: say so, not "no findings"
        tool = (run.meta.get("imported") or {}).get("tool") or "another tool"
        problems.append(f"imported aggregate only (from {tool}): no per-request records, "
                        "so no rule can check it; import the tool's per-request file")  # fmt: skip
    return Diagnosis(run, label or run.name, view.engine, view.scheduler, findings,
                     len(view.ok), vitals(view), failed, problems)  # fmt: skip


def select_rules(names: list[str] | None) -> tuple[Rule, ...]:
    from cbbench.harness.errors import CbbenchError

    if not names:
        return RULES
    by_id = {r.id: r for r in RULES}
    bad = [n for n in names if n not in by_id]
    if bad:
        raise CbbenchError(f"unknown rule {bad[0]!r} (known: {', '.join(by_id)})")
    return tuple(by_id[n] for n in names)


__all__ = [
    "ENGINES",
    "RULES",
    "Diagnosis",
    "Finding",
    "Rule",
    "RunView",
    "diagnose_run",
    "select_rules",
]
