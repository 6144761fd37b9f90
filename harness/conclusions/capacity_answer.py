"""The capacity search's answer as text, from sweep.json's `capacity` (harness/sweep/capacity.py):
what `sweep --find-max-rate` prints at its end, and what `report` says of that sweep folder."""

from __future__ import annotations

from typing import Any


def capacity_lines(index: dict[str, Any]) -> list[str]:
    """The answer (or why there is none) and the repeat rule; [] for a sweep of another kind."""
    cap = index.get("capacity")
    if not isinstance(cap, dict):
        return []
    lo, hi = cap["interval"]
    if cap.get("undecided"):
        below = f"; met up to {lo:.3g} req/s" if lo is not None else ""
        _, capped, why = cap["stopped"].partition("; capped at ")
        if lo is not None and capped:  # say where a number no level's row shows comes from
            below += f" (capped at {why})"
        offered = cap.get("offered")
        if lo is not None and offered:  # the met level's runs offered less than it
            below += (
                f" (met at {offered['offered_rps']:.3g} req/s offered, below the "
                f"{offered['level']:.4g}/s level)"
            )
        first = f"cannot decide: {cap['undecided']}{below}"
    elif lo is None:
        first = f"no rate met the SLO ({cap['stopped']})"
    else:
        upper = f"{hi:.3g}" if hi is not None else "?"
        first = (
            f"max rate meeting {index['slo']} for {index['goodput']:.0%} of requests: "
            f"{lo:.3g} req/s (interval [{lo:.3g}, {upper}); {cap['stopped']}; "
            f"{cap['requests']} requests, {cap['wall_s']:.0f} s)"
        )
    lines = [first, f"rule: {cap.get('rule', '')} (--repeats {index.get('repeats', '?')})"]
    near = [t for t in cap.get("trials", []) if t.get("timing_note")]
    if near:  # one line: the levels whose verdict the client's own timing error could flip
        rates = ", ".join(dict.fromkeys(f"{t['rate']:.4g}/s" for t in near))
        lines.append(
            f"read with care: the verdict at {rates} lies within the load generator's timing "
            f"error bound of the SLO ({near[0]['run'] or near[0]['rate']}: {near[0]['timing_note']})"
        )
    return lines
