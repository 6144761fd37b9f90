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


def _with_client(run: Path, ttft_p50: float, bound: float) -> Path:
    meta = json.loads((run / "run.json").read_text())
    meta.setdefault("summary", {})["client"] = {
        "timing_bound_s": bound,
        "timing_bound_reference_s": ttft_p50,
        "timing_bound_judged_against": "TTFT p50",
        "timing_bound_limit_s": max(0.001, 0.1 * ttft_p50),
        "timing_bound_exceeded": bound > max(0.001, 0.1 * ttft_p50),
    }
    (run / "run.json").write_text(json.dumps(meta))
    return run


def test_timing_banner_once_and_only_when_it_changes_the_comparison(tmp_path: Path) -> None:
    """Finding 20: three runs on a busy host gave three TIMING banners although none could
    reorder them. A material bound is said once, and in a comparison only when the bounds
    exceed the gap between the runs' figures."""
    from cbbench.harness.report.runs import load_runs, timing_warnings

    def runs(*figs: tuple[float, float]) -> list[Path]:
        root = tmp_path / f"set{len(list(tmp_path.iterdir()))}"
        return [
            _with_client(write_run(root / f"r{i}", n=20, seed=i, max_output=8), f, b)
            for i, (f, b) in enumerate(figs)
        ]

    # 3 ms of a 20 ms TTFT is material, but the others are 40 and 80 ms away: no banner
    assert timing_warnings(load_runs(runs((0.020, 0.003), (0.040, 0.0005), (0.080, 0.003)))) == []
    # a run 2 ms away: the bounds could reorder them, one line naming the run
    said = timing_warnings(load_runs(runs((0.020, 0.003), (0.022, 0.003), (0.080, 0.003))))
    assert len(said) == 1 and "enough to change the comparison" in said[0]
    assert "r0 3.00 ms of TTFT p50 20.00 ms" in said[0] and "r2" not in said[0]
    # one run: judged against its own latencies
    one = timing_warnings(load_runs(runs((0.020, 0.003))))
    assert len(one) == 1 and "enough to change its latencies" in one[0]
