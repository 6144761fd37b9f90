"""What `cbbench run` does after its runs (harness/studies/run_demo.py): the timing bound
said once over them, and no folder left by a run that failed before any run folder."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console


def remove_if_only_workload(parent: Path) -> None:
    """Remove the run's parent folder if it holds nothing but the workload written into it."""
    try:
        left = list(parent.iterdir())
        if all(p.name == "workload.json" for p in left):
            for p in left:
                p.unlink()
            parent.rmdir()
    except OSError:
        pass


def timing_note(run_dirs: list[Path], console: Console) -> None:
    """The load generator's timing bound said once over the schedulers' runs, and only where
    it could reorder them (report.runs.timing_warnings), not in each run's summary."""
    from cbbench.harness.report.runs import load_runs, timing_warnings

    if run_dirs:
        for line in timing_warnings(load_runs([str(d) for d in run_dirs])):
            console.print(f"timing: {line}", highlight=False, markup=False, soft_wrap=True)
