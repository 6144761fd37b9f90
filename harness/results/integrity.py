"""Whether a run folder is whole. run.json counts the records its run wrote (`records`:
`written`, every line of requests.jsonl with warmup; `measured`, without); a folder whose
requests.jsonl holds fewer (cut, copied half-way, a torn last line) says how many are missing,
and one that was killed or interrupted says it is partial. One rule, read by `report`,
`diagnose`, `gate` and `export`: `trust_problems(run)`.

Runs written before the count fall back to their summary's `counts.total` (the measured
records the summary was computed over).
"""

from __future__ import annotations

from collections.abc import Iterable

from cbbench.harness.results.outcome import incomplete_reason
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.run_folder import REQUESTS_FILE, Run

RECORDS_KEY = "records"  # run.json: {"written": n, "measured": m}


def record_counts(records: Iterable[RequestRecord]) -> dict[str, int]:
    """What run.json says its requests.jsonl holds."""
    rows = list(records)
    return {"written": len(rows), "measured": sum(not r.warmup for r in rows)}


def expected_measured(meta: dict) -> int | None:
    """The measured records run.json says were written (None: it does not say)."""
    counted = meta.get(RECORDS_KEY)
    if isinstance(counted, dict) and isinstance(counted.get("measured"), int):
        return counted["measured"]
    total = ((meta.get("summary") or {}).get("counts") or {}).get("total")
    return total if isinstance(total, int) else None


def missing_records(run: Run) -> int:
    """Measured records run.json counts that requests.jsonl does not hold (0: none)."""
    expected = expected_measured(run.meta)
    have = sum(not r.warmup for r in run.records)
    return max(0, expected - have) if expected is not None else 0


def damage(run: Run) -> str | None:
    """A one-line account of a damaged requests.jsonl, or None when it is whole."""
    expected = expected_measured(run.meta)
    have = sum(not r.warmup for r in run.records)
    torn = "its last line is torn (dropped)" if run.torn else ""
    if expected is not None and have < expected:
        why = f"; {torn}" if torn else ""
        return (
            f"{REQUESTS_FILE} holds {have} of the {expected} measured records run.json counts: "
            f"{expected - have} missing (the file was cut or copied part-way){why}; every "
            f"figure here covers the {have} it holds"
        )
    if expected is not None and have > expected:
        return (
            f"{REQUESTS_FILE} holds {have} measured records, run.json counts {expected}: "
            "records were added after the run ended"
        )
    if torn:
        return f"{REQUESTS_FILE}: {torn}; 1 record is missing"
    return None


def trust_problems(run: Run) -> list[str]:
    """Why a run holds less than it should: killed or interrupted (partial), damaged."""
    out = []
    reason = incomplete_reason(run.meta)
    if reason:
        out.append(f"partial: the run {reason}")
    hurt = damage(run)
    if hurt:
        out.append(f"damaged: {hurt}")
    return out
