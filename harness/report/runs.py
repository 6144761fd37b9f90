"""Finding runs (a sweep folder expands to its load levels) and reading their metadata."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cbbench.harness.errors import CbbenchError
from cbbench.harness.results.run_folder import REQUESTS_FILE, Run, load_run

SWEEP_FILE = "sweep.json"


@dataclass
class LoadedRun:
    run: Run
    label: str  # unique display name
    sweep: str | None  # the folder it was found in, when given a folder of runs
    in_sweep: bool = False  # that folder is a load sweep (has sweep.json)

    @property
    def meta(self) -> dict[str, Any]:
        return self.run.meta

    @property
    def simulated(self) -> bool:
        return bool(self.meta.get("simulated"))


def _natural_key(p: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]


def _sweep_members(d: Path) -> list[Path]:
    index = d / SWEEP_FILE
    if index.exists():
        try:
            names = json.loads(index.read_text(encoding="utf-8")).get("runs", [])
        except (json.JSONDecodeError, AttributeError):
            raise CbbenchError(f"{index}: not a valid sweep index") from None
        members = [d / str(n) for n in names if (d / str(n) / REQUESTS_FILE).exists()]
        if members:
            return members
    return sorted((p for p in d.iterdir() if (p / REQUESTS_FILE).exists()), key=_natural_key)


def expand(paths: list[str | Path]) -> list[tuple[Path, str | None]]:
    """Run folders named by `paths`; a sweep folder (run folders inside) expands to its runs."""
    out: list[tuple[Path, str | None]] = []
    for raw in paths:
        d = Path(raw)
        if not d.is_dir():
            raise CbbenchError(f"{d}: no such run folder")
        if (d / REQUESTS_FILE).exists():
            out.append((d, None))
            continue
        members = _sweep_members(d)
        if not members:
            raise CbbenchError(f"{d}: neither a run folder (no {REQUESTS_FILE}) nor a sweep folder")
        out.extend((m, d.name) for m in members)
    return out


def load_runs(paths: list[str | Path]) -> list[LoadedRun]:
    found = expand(paths)
    runs = [
        LoadedRun(load_run(d), "", s, s is not None and (d.parent / SWEEP_FILE).exists())
        for d, s in found
    ]
    # a run is named after its folder (what the user typed and can find again), not its
    # workload: two runs of one workload are otherwise "mixed" and "mixed #2"
    bases = [
        lr.run.dir.name if lr.sweep is None else f"{lr.sweep}/{lr.run.dir.name}" for lr in runs
    ]
    twice = {b for b in bases if bases.count(b) > 1}
    seen: dict[str, int] = {}
    for lr, base in zip(runs, bases, strict=True):
        if base in twice and lr.sweep is None:  # results/a/run and results/b/run
            base = f"{lr.run.dir.parent.name}/{base}"
        n = seen.get(base, 0)
        seen[base] = n + 1
        lr.label = base if n == 0 else f"{base} #{n + 1}"
    return runs


def workload_identity(meta: dict[str, Any]) -> tuple[str | None, Any]:
    """(workload name, seed) as recorded in run.json; None where unknown."""
    w = meta.get("workload")
    seed = meta.get("seed")
    name = None
    if isinstance(w, dict):
        name = w.get("name") or w.get("spec") or w.get("preset") or w.get("path")
        seed = w.get("seed", seed)
    elif isinstance(w, str):
        name = w
    return (None if name is None else str(name), seed)


def load_level(meta: dict[str, Any]) -> str | None:
    """'rate 4/s', 'concurrency 16', ... from run.json's load settings, if any."""
    for src in (meta.get("load"), meta.get("config"), meta):
        if not isinstance(src, dict):
            continue
        for key, unit in (("rate", "/s"), ("request_rate", "/s"), ("concurrency", "")):
            v = src.get(key)
            if isinstance(v, float) and v == float("inf"):
                return "all at once"
            if v is not None and not isinstance(v, (dict, list)):
                return f"{key} {v}{unit}"
    return None


def trust_warnings(runs: list[LoadedRun]) -> list[str]:
    """Runs to read with care: killed or interrupted before the end, or a server that stopped
    answering mid-run (harness/results/outcome.py)."""
    from cbbench.harness.results.integrity import damage
    from cbbench.harness.results.outcome import incomplete_reason

    out = []
    for lr in runs:
        reason = incomplete_reason(lr.meta)
        if reason:
            out.append(f"{lr.label} {reason}")
        hurt = damage(lr.run)
        if hurt:
            out.append(f"{lr.label}: {hurt}")
        stopped = (lr.meta.get("summary") or {}).get("server_stopped_answering")
        if stopped:
            out.append(f"{lr.label}: {stopped}")
    return out


def timing_warnings(runs: list[LoadedRun]) -> list[str]:
    """Runs where a load-generator worker's bound on its p99 timing error exceeds the limit
    (summary client.timing_bound_s, harness/results/client_timing.py: a material share of the
    run's TTFT p50): their latencies may be off by that much."""
    out = []
    for lr in runs:
        client = (lr.meta.get("summary") or {}).get("client") or {}
        if client.get("timing_bound_exceeded"):
            out.append(
                f"{lr.label}: a load-generator worker's timing error bound "
                f"{client['timing_bound_s'] * 1e3:.2f} ms exceeds "
                f"{client['timing_bound_limit_s'] * 1e3:.2f} ms, a material share of "
                f"{client.get('timing_bound_judged_against') or 'its latencies'} (more workers, "
                "cores or hosts)"
            )
    return out


def comparability_warnings(runs: list[LoadedRun]) -> list[str]:
    """Reasons the runs should not be compared side by side (different workloads or seeds)."""
    ids = {lr.label: workload_identity(lr.meta) for lr in runs}
    warnings = []
    names = {n for n, _ in ids.values()}
    seeds = {repr(s) for _, s in ids.values()}
    if len(names) > 1:
        listed = ", ".join(f"{k}: {n or 'unknown'}" for k, (n, _) in ids.items())
        warnings.append(f"runs use different workloads ({listed})")
    if len(seeds) > 1:
        listed = ", ".join(f"{k}: {s}" for k, (_, s) in ids.items())
        warnings.append(f"runs use different workload seeds ({listed})")
    sims = {lr.simulated for lr in runs}
    if len(sims) > 1:
        warnings.append("simulated and measured runs are mixed")
    return warnings


def flatten(meta: dict[str, Any], prefix: str = "", skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Nested run.json -> {'a.b': 'value'} for display; long lists are shortened."""
    out: dict[str, str] = {}
    for k, v in meta.items():
        if not prefix and k in skip:
            continue
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        elif isinstance(v, list) and len(v) > 8:
            out[key] = f"[{len(v)} items]"
        else:
            out[key] = v if isinstance(v, str) else json.dumps(v, default=str)
    return out
