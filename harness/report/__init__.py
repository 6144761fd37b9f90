"""cbbench.harness.report: HTML and Markdown reports comparing run folders."""

from __future__ import annotations

from dataclasses import dataclass

from cbbench.harness.report.runs import LoadedRun, load_runs
from cbbench.harness.report.samples import RunSamples, extract
from cbbench.harness.report.table import summary_row


@dataclass
class Report:
    runs: list[LoadedRun]
    samples: list[RunSamples]
    rows: list[dict]

    def html(self) -> str:
        from cbbench.harness.report.html import render

        return render(self.runs, self.samples, self.rows)

    def markdown(self) -> str:
        from cbbench.harness.report.markdown import render_markdown

        return render_markdown(self.runs, self.rows)


def build_report(paths: list) -> Report:
    """Load the run folders (sweep folders expand) and summarise each."""
    runs = load_runs(paths)
    samples = [extract(lr.run) for lr in runs]
    rows = [summary_row(lr, s) for lr, s in zip(runs, samples, strict=True)]
    return Report(runs=runs, samples=samples, rows=rows)
