"""Issue 51, finding 10: the report's best-value star goes to the one best value a reader can
see (not to ties, not to a difference below the printed precision), and the footnote says the
SLO goodput was counted against."""

from __future__ import annotations

import json
from pathlib import Path

from cbbench.harness.report import build_report
from cbbench.harness.report.table import best_index, fmt_column
from report_synth import write_run


def test_star_only_for_a_visible_unique_best() -> None:
    assert best_index([1.0, 2.0, 3.0], "high") == {2}
    assert best_index([3.0, 1.0, 3.0], "high") == set()  # a tie: no star
    values = [370.44, 370.41, 12.0]  # 370.4 both, as printed: no star
    assert best_index(values, "high", fmt_column(values)) == set()
    values = [370.46, 370.41]
    assert best_index(values, "high", fmt_column(values)) == {0}  # 370.5 vs 370.4
    assert best_index([0.5], "low") == set()  # one run: nothing to rank


def test_footnote_names_the_slo(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", n=30, seed=1, max_output=8)
    b = write_run(tmp_path / "b", n=30, seed=2, max_output=8)
    for run in (a, b):
        meta = json.loads((run / "run.json").read_text())
        meta.setdefault("load", {})["slo_s"] = {"ttft": 0.5, "tpot": 0.05}
        (run / "run.json").write_text(json.dumps(meta))
    html = build_report([a, b]).html()
    assert "Goodput: requests within TTFT 500 ms and TPOT 50 ms." in html
    assert "needs an SLO" not in html
    meta = json.loads((b / "run.json").read_text())
    meta["load"]["slo_s"] = {}
    (b / "run.json").write_text(json.dumps(meta))
    html = build_report([a, b]).html()
    assert "Goodput: requests within TTFT 500 ms and TPOT 50 ms; goodput needs an SLO" in html
    assert "(<code>--slo</code>) for b." in html
