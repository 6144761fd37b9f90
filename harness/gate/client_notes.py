"""What the gate says of a run whose load generator, not the server, may have made its numbers
(summary `client_bound` and `client.timing_bound_exceeded`, harness/results/client_timing.py):
a REGRESSION or PASS between such runs may be the client's. Shown, never a verdict change."""

from __future__ import annotations

from typing import Any


def client_notes(runs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """One line per run (label, run.json) whose client set the pace or whose timing error
    bound is a material share of its latencies."""
    out = []
    for label, meta in runs:
        summary = meta.get("summary") if isinstance(meta.get("summary"), dict) else {}
        client = summary.get("client") if isinstance(summary.get("client"), dict) else {}
        said = []
        if summary.get("client_bound"):
            said.append(
                f"CLIENT-BOUND ({summary.get('client_bound_reason') or 'the client set the pace'})"
            )
        bound, ref = client.get("timing_bound_s"), client.get("timing_bound_reference_s")
        if client.get("timing_bound_exceeded") and bound is not None:
            of = f" of {client.get('timing_bound_judged_against') or 'its latencies'}"
            share = f" ({bound / ref:.0%}{of} {ref * 1e3:.1f} ms)" if ref else ""
            said.append(f"timing error bound {bound * 1e3:.1f} ms{share}")
        if said:
            out.append(
                f"read with care: the {label}'s load generator may have made its numbers: "
                + "; ".join(said)
                + " (more --workers, cores or hosts)"
            )
    return out


def repeats_client_notes(side: str, metas: list[dict[str, Any]]) -> list[str]:
    """For a --repeats folder: one line when any of its repeats was flagged (how many, and the
    first one's line), not one per repeat."""
    flagged = [line for i, m in enumerate(metas, 1) for line in client_notes([(f"repeat {i}", m)])]
    if not flagged:
        return []
    first = flagged[0].removeprefix("read with care: the ")
    return [f"read with care: the {side}: {len(flagged)} of {len(metas)} repeats flagged; {first}"]
