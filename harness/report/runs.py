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
    """At most one line: runs whose load-generator timing error bound (summary
    client.timing_bound_s, harness/results/client_timing.py) is a material share of the figure
    it is judged against (TTFT p50) and, when runs are compared, could also reorder them (the
    bounds of two runs exceed the gap between their figures): only then does it change what a
    reader concludes. A timing bound that no comparison turns on is still in run.json."""

    def client(lr: LoadedRun) -> dict:
        return (lr.meta.get("summary") or {}).get("client") or {}

    flagged = [lr for lr in runs if client(lr).get("timing_bound_exceeded")]
    if len(runs) > 1:

        def could_reorder(lr: LoadedRun) -> bool:
            c = client(lr)
            fig, bound = c.get("timing_bound_reference_s"), c.get("timing_bound_s") or 0.0
            if fig is None:
                return True
            for other in runs:
                o = client(other)
                ofig = o.get("timing_bound_reference_s")
                if other is lr or ofig is None:
                    continue
                if abs(fig - ofig) <= bound + (o.get("timing_bound_s") or 0.0):
                    return True
            return False

        flagged = [lr for lr in flagged if could_reorder(lr)]
    if not flagged:
        return []
    parts = []
    for lr in flagged:
        c = client(lr)
        fig = c.get("timing_bound_reference_s")
        of = f" of {c.get('timing_bound_judged_against') or 'its latencies'} " + (
            f"{fig * 1e3:.2f} ms" if fig is not None else ""
        )
        parts.append(f"{lr.label} {c['timing_bound_s'] * 1e3:.2f} ms{of.rstrip()}")
    which = "the comparison" if len(runs) > 1 else "its latencies"
    return [
        "a load-generator worker's timing error bound is a material share of the figures, "
        f"enough to change {which}: " + "; ".join(parts) + " (more workers, cores or hosts)"
    ]


def comparability_warnings(runs: list[LoadedRun], severity: str = "incomparable") -> list[str]:
    """Why the runs should not be compared side by side (results/comparability.py: another
    endpoint, streaming mode, load shape, workload, seed, lengths or model, simulated mixed
    with measured); `severity="caution"`: what to read with care (request count, duration).
    Runs of a sweep differ in load level by design: that is not reported for them."""
    from cbbench.harness.results.comparability import CAUTION, LOAD_ASPECTS, among, untold

    skip = LOAD_ASPECTS if any(lr.in_sweep for lr in runs) else ()
    found = among([(lr.label, lr.meta) for lr in runs], skip=skip)
    out = [text for sev, text in found if sev == severity]
    unsaid = untold(*(lr.meta for lr in runs)) if not skip else None  # a sweep: one server
    return out + [unsaid] if severity == CAUTION and unsaid else out


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


def sweep_answers(runs: list[LoadedRun]) -> list[str]:
    """What each capacity search among the runs' sweep folders concluded (sweep.json's
    `capacity`, the lines `sweep --find-max-rate` printed), one line each: the report of a
    sweep folder otherwise showed its levels and not the answer they were run for."""
    from cbbench.harness.conclusions.capacity_answer import capacity_lines

    out, seen = [], set()
    for lr in runs:
        folder = lr.run.dir.parent
        if not lr.in_sweep or folder in seen:
            continue
        seen.add(folder)
        try:
            index = json.loads((folder / SWEEP_FILE).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        lines = capacity_lines(index) if isinstance(index, dict) else []
        if lines:
            out.append(f"{lr.sweep}: capacity search: " + "; ".join(lines))
    return out
