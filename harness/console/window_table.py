"""The steady window's figures as a table beside the whole run's (`bench`, `merge`): each
latency's percentiles and the rates, one column for the whole run and one for the window the
summary found or was given (`summary["window_figures"]`, harness/conclusions/window.py)."""

from __future__ import annotations

import math

from rich.table import Table

ROWS = (("TTFT", "ttft_s", ("p50", "p90", "p99")), ("TPOT", "tpot_s", ("p50", "p99")),
        ("ITL", "itl_s", ("p50", "p99")), ("E2E", "e2e_s", ("p50", "p99")))  # fmt: skip


def _ms(block: dict, key: str) -> str:
    v = block.get(key)
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1e3:.2f}"


def _rate(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def window_table(summary: dict) -> Table | None:
    """None when the run has no window figures (no steady window, or `--window all`)."""
    wf = summary.get("window_figures")
    if not wf:
        return None
    w = wf["window"]
    kind = "steady window" if w["kind"] == "steady" else "window"
    lead = "the window" if summary.get("lead") not in (None, "all") else "the whole run"
    t = Table(
        title=f"{kind} {w['start_s']:.1f}-{w['end_s']:.1f} s beside the whole run "
        f"(the summary leads with {lead})"
    )
    t.add_column("metric")
    t.add_column("whole run", justify="right")
    t.add_column(kind, justify="right")
    for label, key, pcts in ROWS:
        whole, inside = summary.get(key) or {}, wf.get(key) or {}
        if not whole.get("count") and not inside.get("count"):
            continue
        for p in pcts:
            t.add_row(f"{label} {p} (ms)", _ms(whole, p), _ms(inside, p))
    counts = summary.get("counts") or {}
    t.add_row("requests sent", str(counts.get("total", "-")), str(wf["counts"]["total"]))
    t.add_row("requests/s", _rate(summary.get("request_throughput"), ".2f"),
              _rate(wf.get("request_throughput"), ".2f"))  # fmt: skip
    t.add_row("output tok/s", _rate(summary.get("output_throughput"), ".1f"),
              _rate(wf.get("output_throughput"), ".1f"))  # fmt: skip
    if w.get("warning"):
        t.caption = w["warning"]
    return t
