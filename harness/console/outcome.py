"""The lines printed under a run's summary table that say how the run ended: interrupted
(how many requests finished, were cancelled in flight, were never sent), stopped early, and
the top failure reasons, verbatim (one real message per group: `summary.errors_by_reason`);
and the per-worker timing lines with the timing-bound warning."""

from __future__ import annotations

from cbbench.harness.results.client_timing import (
    TIMING_BOUND_LIMIT_S,
    TIMING_BOUND_MATERIAL_SHARE,
)

TOP_REASONS = 3


def outcome_lines(
    summary: dict,
    *,
    interrupted: bool = False,
    planned: int | None = None,
    stopped: str | None = None,
) -> list[str]:
    """`planned`: measured requests the run meant to send (None: unknown); `stopped`: why a
    watch (sweep's) stopped the run early, which is not a Ctrl-C."""
    c = summary.get("counts") or {}
    out: list[str] = []
    finished = c.get("total", 0)
    cancelled = summary.get("cancelled_in_flight") or 0
    if interrupted or stopped:
        of = f" of {planned}" if planned else ""
        unsent = f", {planned - finished - cancelled} never sent" if planned else ""
        head = f"STOPPED ({stopped})" if stopped else "INTERRUPTED (Ctrl-C)"
        out.append(
            f"{head}: the figures above cover the {finished}{of} requests that "
            f"finished; {cancelled} cancelled in flight{unsent}"
        )
    failed = c.get("failed") or 0
    reasons = summary.get("errors_by_reason") or {}
    if failed and reasons:
        shown = list(reasons.items())[:TOP_REASONS]
        out.append(f"failed {failed} of {finished}; top reasons:")
        out.extend(f"  {n} x {why}" for why, n in shown)
        rest = failed - sum(n for _, n in shown)
        if rest > 0:
            out.append(f"  {rest} more (requests.jsonl: each record's error)")
    return out


def worker_timing_lines(summary: dict) -> list[str]:
    """One line per worker (loop lag, send lag, send window, timing bound), then a warning
    when a bound exceeds the limit: the user needs more workers, cores or hosts."""
    client = summary.get("client") or {}
    rows = client.get("workers") or []

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x * 1e3:.3f}"

    out = []
    for x in rows:
        out.append(
            f"worker {x['worker']}: {x['requests']} requests, {x['timestamp_source']} stamps, "
            f"loop lag p99 {ms(x['loop_lag_s']['p99'])} ms, read delay p99 "
            f"{ms(x['read_delay_s']['p99'])} ms, send lag p99 "
            f"{ms(x['send_lag_s']['p99'])} ms, send window p99 {ms(x['send_window_s']['p99'])} "
            f"ms; timing error bound (p99) {ms(x['timing_bound_s'])} ms"
            + (f" (stalled: {x['stall']})" if x.get("stall") else "")
        )
    if client.get("timing_bound_exceeded"):
        against = client.get("timing_bound_judged_against") or "the latencies"
        bound, figure = client["timing_bound_s"], client.get("timing_bound_reference_s")
        share = (  # the share itself: "over 1.586 ms" left the reader to guess what 1.586 was
            f"is {bound / figure:.0%} of {against} {ms(figure)} ms (flagged over "
            f"{TIMING_BOUND_MATERIAL_SHARE:.0%} of it and over {ms(TIMING_BOUND_LIMIT_S)} ms)"
            if figure
            else f"is over {ms(client['timing_bound_limit_s'])} ms (a material share of {against})"
        )
        out.append(
            f"TIMING BOUND MATERIAL: a worker's bound {ms(bound)} ms {share}: its times may be "
            "off by that much (more --workers, cores or hosts; kernel stamps where possible)"
        )
    return out
