"""cbbench.harness.report: HTML and Markdown reports comparing run folders.

Layer: report (run folders -> HTML and Markdown).
Imports: conclusions, diagnose, results.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cbbench.harness.report.runs import (
    LoadedRun,
    comparability_warnings,
    load_runs,
    timing_warnings,
    trust_warnings,
)
from cbbench.harness.report.samples import RunSamples, extract
from cbbench.harness.report.table import summary_row


@dataclass
class Report:
    runs: list[LoadedRun]
    samples: list[RunSamples]
    rows: list[dict]
    diagnoses: list = field(default_factory=list)  # harness.diagnose.Diagnosis, one per run

    def comparability_warnings(self, severity: str = "incomparable") -> list[str]:
        """Why these runs should not be compared side by side (results/comparability.py);
        `severity="caution"`: what to read with care (request count, server settings)."""
        return comparability_warnings(self.runs, severity)

    def trust_warnings(self) -> list[str]:
        """Runs killed, interrupted, or whose server stopped answering, and runs whose timing
        error bound exceeds the limit (flagged, not hidden)."""
        return trust_warnings(self.runs) + timing_warnings(self.runs)

    def html(self) -> str:
        from cbbench.harness.diagnose.render import html as diagnosis_html
        from cbbench.harness.report.html import render

        return render(self.runs, self.samples, self.rows, diagnosis_html(self.diagnoses))

    def markdown(self) -> str:
        from cbbench.harness.diagnose.render import markdown as diagnosis_markdown
        from cbbench.harness.report.markdown import render_markdown

        return render_markdown(self.runs, self.rows) + "\n" + diagnosis_markdown(self.diagnoses)


def build_report(paths: list) -> Report:
    """Load the run folders (sweep folders expand) and summarise each."""
    runs = load_runs(paths)
    samples = [extract(lr.run) for lr in runs]
    rows = [summary_row(lr, s) for lr, s in zip(runs, samples, strict=True)]
    from cbbench.harness.diagnose import diagnose_run

    diagnoses = [diagnose_run(lr.run, lr.label) for lr in runs]
    return Report(runs=runs, samples=samples, rows=rows, diagnoses=diagnoses)
