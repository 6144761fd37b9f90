"""Other tools' result formats (import) and the exchange format (export): one small module per
format, each converting to or from run folders.

- `vllm_bench`: `vllm bench serve --save-result [--save-detailed]` JSON
- `guidellm`: guidellm's benchmarks report (JSON or YAML)
- `aiperf`: AIPerf's `profile_export.jsonl` (per request) and `profile_export_aiperf.json`
- `inference_perf`: inference-perf's per-request and summary lifecycle reports
- `benchmark_report`: the llm-d benchmark report v0.2.1 (export); `benchmark_report_import`:
  one read back (aggregate only)
- `imported`: what every importer returns and how it becomes a run folder

Layer: results (a room of it).
Imports: results, workloads.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from cbbench.harness.errors import CbbenchError
from cbbench.harness.results.formats import (
    aiperf,
    benchmark_report_import,
    guidellm,
    inference_perf,
    vllm_bench,
)
from cbbench.harness.results.formats.files import parse
from cbbench.harness.results.formats.imported import Imported

SUFFIXES = tuple(s + z for s in (".json", ".jsonl", ".yaml", ".yml") for z in ("", ".gz"))
FORMATS: dict[str, ModuleType] = {
    "vllm-bench": vllm_bench,
    "guidellm": guidellm,
    "aiperf": aiperf,
    "inference-perf": inference_perf,
    "benchmark-report": benchmark_report_import,
}


def _in_folder(folder: Path) -> Path:
    """A tool's output folder: the file in it to import (per-request data first)."""
    for name in aiperf.FILES + inference_perf.FILES:
        for candidate in (folder / name, folder / (name + ".gz")):
            if candidate.exists():
                return candidate
    found = [p for p in sorted(folder.iterdir()) if p.name.endswith(SUFFIXES)]
    if len(found) == 1:
        return found[0]
    raise CbbenchError(f"{folder}: no result file found to import (name the file)")


def detect(data: Any) -> str | None:
    for name, mod in FORMATS.items():
        if mod.sniff(data):
            return name
    return None


def read_source(source: str | Path, fmt: str | None = None) -> tuple[list[Imported], str, Path]:
    """(the runs the file holds, its format, the file read). `fmt` forces a format."""
    path = Path(source)
    if not path.exists():
        raise CbbenchError(f"{path}: no such file or folder")
    if path.is_dir():
        path = _in_folder(path)
    if fmt is not None and fmt not in FORMATS:
        raise CbbenchError(f"--format {fmt}: unknown (one of {', '.join(FORMATS)})")
    data = parse(path)
    name = fmt or detect(data)
    if name is None:
        raise CbbenchError(
            f"{path}: not a result file of a known tool ({', '.join(FORMATS)}); "
            "pass --format NAME if it is one"
        )
    try:
        runs = FORMATS[name].read(data, path)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise CbbenchError(
            f"{path}: not a valid {name} result ({type(exc).__name__}: {exc})"
        ) from None
    return runs, name, path
