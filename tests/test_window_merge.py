"""The steady window in the console table (harness/console/window_table.py) and in merged runs
(harness/conclusions/merge_window.py): a merged run finds its window on the merged records as
one run does, so `gate` compares merged runs over their steady windows; shards that led with
different windows, or one stopped over-saturated, merge to the whole run, with a note."""

from __future__ import annotations

from cbbench.harness.conclusions.merge_window import add_merged_window
from cbbench.harness.conclusions.window import add_window_summary, run_lead
from cbbench.harness.console.window_table import window_table
from cbbench.harness.results.summary import summarize
from rich.console import Console
from test_rigor_window import synthetic


def _summary(records, spec="steady") -> dict:
    s = dict(summarize(records))
    add_window_summary(s, records, spec)
    return s


def _shards(*leads: str, status: str = "complete") -> list[dict]:
    return [{"status": status, "summary": {"lead": lead}, "load": {}} for lead in leads]


def test_the_window_prints_as_a_table_beside_the_whole_run():
    recs = synthetic(ramp=4.0, poisson=False)
    s = _summary(recs)
    wf = s["window_figures"]
    con = Console(record=True, width=80)
    con.print(window_table(s))
    text = con.export_text()
    assert text.lstrip().startswith("steady window")
    row = next(line for line in text.splitlines() if "TTFT p99 (ms)" in line)
    whole, inside = (float(x) for x in row.replace("│", " ").split()[3:5])
    assert whole == round(s["ttft_s"]["p99"] * 1e3, 2)  # the warm-up is in the whole run
    assert inside == round(wf["ttft_s"]["p99"] * 1e3, 2) and inside < whole
    sent = next(line for line in text.splitlines() if "requests sent" in line)
    assert sent.replace("│", " ").split()[2:4] == [str(len(recs)), str(wf["counts"]["total"])]
    assert window_table(_summary(recs, "all")) is None  # no window figures: no table


def test_merged_runs_carry_the_window_their_shards_led_with():
    recs = synthetic(ramp=4.0)
    one = _summary(recs)
    merged: dict = dict(summarize(recs))
    add_merged_window(merged, recs, _shards("steady", "steady", "steady"))
    for key in ("steady_window", "window_figures", "lead"):
        assert merged[key] == one[key], key
    assert merged["lead"] == "steady" and run_lead({"summary": merged}) == "steady"

    ranged: dict = {}
    shards = [{"summary": {"lead": "range", "window_figures": {"window": {"start_s": 5.0,
              "end_s": 15.0}}}, "load": {}} for _ in range(2)]  # fmt: skip
    add_merged_window(ranged, recs, shards)
    assert ranged["lead"] == "range" and ranged["window_figures"]["window"]["start_s"] == 5.0

    mixed: dict = {}
    add_merged_window(mixed, recs, _shards("steady", "all"))
    assert mixed["lead"] == "all" and mixed["window_figures"] is None
    assert "different windows" in mixed["lead_note"]

    stopped: dict = {}
    add_merged_window(stopped, recs, _shards("steady", "steady", status="over-saturated"))
    assert stopped["steady_window"] is None and stopped["lead"] == "all"
    assert "over-saturated" in stopped["lead_note"]
