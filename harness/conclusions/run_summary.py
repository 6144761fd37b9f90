"""What one run's summary says beyond its whole-run figures: the steady window's figures beside
them (window.py) and the over-saturation verdict (saturation_watch.py); the lines `bench`
prints for them."""

from __future__ import annotations

from cbbench.harness.conclusions.saturation import too_short
from cbbench.harness.conclusions.window import add_window_summary, window_line
from cbbench.harness.results.records import RequestRecord

OVER_SATURATED = "over-saturated"  # run.json status of a run the watch stopped


def add_run_conclusions(
    summary: dict, records: list[RequestRecord], window, slo: dict | None, observers: list
) -> None:
    found = next((o.found for o in observers if getattr(o, "found", None)), None)
    add_window_summary(summary, records, window, slo, steady=found is None)
    if found is not None:
        summary["over_saturated"] = found
        return
    short = next((o for o in observers if getattr(o, "too_short_to_judge", False)), None)
    if short is not None:
        done = [r for r in records if not r.warmup and r.ok and r.end_s is not None]
        last = max((r.end_s for r in done), default=None)
        summary["saturation_not_judged"] = too_short(short.arrivals, len(done), last)


def conclusion_lines(summary: dict, window_table: bool = False) -> list[str]:
    """`window_table`: the window's figures were printed as a table (harness/console/
    window_table.py), so the one-line form is left out; a note (no window) still prints."""
    lines = []
    w = window_line(summary)
    if w and not (window_table and summary.get("window_figures")):
        lines.append(w)
    if (summary.get("saturation_not_judged") or {}).get("line"):
        lines.append(summary["saturation_not_judged"]["line"])
    if (summary.get("duration_not_reached") or {}).get("line"):
        lines.append(summary["duration_not_reached"]["line"])
    sat = summary.get("over_saturated")
    if sat:
        kept = (summary.get("counts") or {}).get("total", 0)
        if sat.get("stopped"):
            lines.append(
                f"{sat['line']}: stopped ({sat['reason']}); the {kept} requests that finished "
                "are kept (--on-saturation continue runs on)"
            )
        else:
            lines.append(f"{sat['line']}: {sat['reason']} (--on-saturation continue: ran on)")
    return lines


def duration_not_reached(
    records: list[RequestRecord], duration_s: float | None, planned: int
) -> dict | None:
    """A run given --duration that sent every planned request well before it: the request
    count (--num-requests, or the workload's own: 200 for a preset) ended it first, which the
    summary's "duration" alone leaves the reader to notice. None when the duration was used."""
    sent = [r.sent_s for r in records if not r.warmup and r.sent_s is not None]
    if duration_s is None or not sent or len(sent) < planned:
        return None
    last = max(sent)
    if last >= 0.9 * duration_s:
        return None
    line = (f"ended before --duration {duration_s:g} s: all {planned} requests were sent by "
            f"{last:.1f} s (the request count ends a run first: --num-requests, else the "
            "workload's own; raise it to run for the duration)")  # fmt: skip
    return {"duration_s": duration_s, "requests": planned, "last_send_s": round(last, 3),
            "line": line}  # fmt: skip
