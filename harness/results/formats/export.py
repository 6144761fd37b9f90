"""Writing llm-d benchmark reports: a run folder to one file, a sweep folder to one per level."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cbbench.harness.errors import CbbenchError
from cbbench.harness.results.formats.benchmark_report import to_benchmark_report
from cbbench.harness.results.integrity import trust_problems
from cbbench.harness.results.run_folder import REQUESTS_FILE, Run, load_run

SUFFIXES = (".json", ".yaml", ".yml")


def check_path(path: str | Path) -> Path:
    p = Path(path)
    if p.suffix not in SUFFIXES:
        raise CbbenchError(f"{p}: a benchmark report is .json or .yaml (by suffix)")
    if not p.parent.exists():
        raise CbbenchError(f"{p}: folder {p.parent} does not exist")
    return p


def dump(report: dict, path: Path) -> None:
    check_path(path)
    if path.suffix == ".json":
        text = json.dumps(report, indent=2) + "\n"
    else:
        import yaml

        text = yaml.safe_dump(report, sort_keys=False)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _levels(folder: Path) -> list[Path]:
    index = folder / "sweep.json"
    names: list[str] = []
    if index.exists():
        try:
            names = [str(n) for n in json.loads(index.read_text(encoding="utf-8")).get("runs", [])]
        except (json.JSONDecodeError, AttributeError):
            raise CbbenchError(f"{index}: not a valid sweep index") from None
    found = [folder / n for n in names if (folder / n / REQUESTS_FILE).exists()]
    return found or sorted(p for p in folder.iterdir() if (p / REQUESTS_FILE).exists())


def export_benchmark_reports(run_dir: str | Path, out: str | Path) -> list[str]:
    """Write the report(s); returns one line per file written, and one per run that holds
    less than it should (partial or damaged: exported anyway, the reader must know; the
    report's metadata says so too)."""
    src, dest = Path(run_dir), check_path(out)
    if src.is_dir() and not (src / REQUESTS_FILE).exists():
        levels = _levels(src)
        if not levels:
            raise CbbenchError(f"{src}: neither a run folder nor a sweep folder")
        lines = []
        for level in levels:
            path = dest.with_name(f"{dest.stem}.{level.name}{dest.suffix}")
            lines += _write(load_run(level), path)
        return lines
    return _write(load_run(src), dest)


def _write(run: Run, path: Path) -> list[str]:
    report = to_benchmark_report(run)
    problems = trust_problems(run)
    if problems:
        report["results"]["observability"]["metadata"]["cbbench"]["trust_problems"] = problems
    dump(report, path)
    lines = [f"{run.dir}: benchmark report v0.2.1 -> {path}"]
    return lines + [f"warning: {run.dir} is {p}" for p in problems]
