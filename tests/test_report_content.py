"""Report contents: numbers, best marks, sweeps, warnings, Markdown, downsampling, bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cbbench.harness.cli import main
from cbbench.harness.report import build_report
from cbbench.harness.report.svg import nice_ticks
from cbbench.harness.results.summary import summarize
from report_synth import write_run


def test_summary_row_matches_bench_summary(tmp_path: Path) -> None:
    run = write_run(
        tmp_path / "a", n=80, seed=1, errors=4, meta={"load": {"slo_s": {"ttft": 0.05}}}
    )
    rep = build_report([run])
    row = rep.rows[0]
    s = summarize(rep.runs[0].run.records, slo={"ttft": 0.05})
    assert row["output_throughput"] == pytest.approx(s["output_throughput"])
    assert row["ttft.p99"] == pytest.approx(s["ttft_s"]["p99"])
    assert row["goodput"] == pytest.approx(s["goodput"]["requests_per_s"])
    assert row["error_rate"] == pytest.approx(4 / 80) and row["requests"] == "76/80"
    assert 0 < row["kv_usage.mean"] <= row["kv_usage.max"] <= 1
    assert row["util_gpu.mean"] == pytest.approx(0.6, abs=0.05)  # 40..80 % in the synthetic run


def test_sweep_folder_expands_in_index_order_and_curves_appear(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    for rate in (8, 1, 2):  # written out of order; sweep.json gives the order
        write_run(sweep / f"rate-{rate}", n=40, seed=rate, rate=rate, max_output=8)
    (sweep / "sweep.json").write_text(json.dumps({"runs": ["rate-1", "rate-2", "rate-8"]}))
    rep = build_report([sweep])
    assert [lr.label for lr in rep.runs] == ["sweep/rate-1", "sweep/rate-2", "sweep/rate-8"]
    html = rep.html()
    assert "Latency vs throughput" in html and "rate 8/s" in html
    (sweep / "sweep.json").unlink()  # without an index: natural order of the folder names
    assert [lr.label for lr in build_report([sweep]).runs][1] == "sweep/rate-2"


def test_not_comparable_and_simulated_are_flagged(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", n=30, seed=1, max_output=8)
    b = write_run(tmp_path / "b", n=30, seed=1, workload_seed=9, max_output=8)
    c = write_run(
        tmp_path / "c", n=30, seed=1, workload="other", meta={"simulated": True}, max_output=8
    )
    rep = build_report([a, b, c])
    html, md = rep.html(), rep.markdown()
    assert "Not comparable: workload differs (a: " in html
    assert "workload seed differs (a: 7, b: 9, c: 7)" in html
    assert "Not comparable: measured or simulated differs" in html
    assert html.count('class="sim"') >= 2  # in the run list and in the tables
    assert "**Not comparable:**" in md and "**SIMULATED**" in md
    same = build_report([a, write_run(tmp_path / "a2", n=30, seed=2, max_output=8)])
    assert "Not comparable" not in same.html()


def test_markdown_table_and_deltas(tmp_path: Path) -> None:
    a = write_run(tmp_path / "base", n=60, seed=1, max_output=8)
    b = write_run(tmp_path / "slow|er", n=60, seed=1, ttft_scale=1.5, errors=3, max_output=8)
    md_path, html_path = tmp_path / "r.md", tmp_path / "r.html"
    argv = ["report", str(a), str(b), "--out", str(html_path), "--markdown", str(md_path)]
    assert main(argv) == 0
    md = md_path.read_text()
    tables = [ln for ln in md.splitlines() if ln.startswith("|")]
    widths = {ln.replace("\\|", "").count("|") for ln in tables[:4]}
    assert len(widths) == 1  # header, rule and both rows have the same number of cells
    assert "slow\\|er" in md  # the pipe in the run name is escaped
    delta = [ln for ln in md.splitlines() if ln.startswith("| slow")][-1].split(" | ")
    rows = build_report([a, b]).rows  # TTFT p50 delta = ratio of the two summaries' p50s
    assert delta[2] == f"{rows[1]['ttft.p50'] / rows[0]['ttft.p50'] - 1:+.1%} worse"
    assert rows[1]["ttft.p50"] > 1.3 * rows[0]["ttft.p50"]
    assert delta[-1] == "+5.0 pp |"  # 3 of 60 failed
    assert len(md) < 2000  # fits a PR comment comfortably


def test_big_run_is_downsampled(tmp_path: Path) -> None:
    run = write_run(tmp_path / "big", n=8000, seed=1, rate=20.0, max_output=6)
    html_path = tmp_path / "big.html"
    assert main(["report", str(run), "--out", str(html_path)]) == 0
    html = html_path.read_text()
    assert len(html.encode()) < 800_000
    points = [int(x) for x in re.findall(r'data-points="(\d+)"', html)]
    assert points and max(points) <= 2000
    assert len(re.findall(r"<circle ", html)) <= 2000  # the scatter keeps a seeded sample


def test_bad_inputs_exit_2(tmp_path: Path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "neither a run folder" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "no such run folder" in capsys.readouterr().err
    run = write_run(tmp_path / "a", n=10, seed=1, max_output=8)
    (tmp_path / "file").write_text("x")
    assert main(["report", str(run), "--out", str(tmp_path / "file" / "r.html")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_nice_ticks() -> None:
    assert nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(3, 97) == [20, 40, 60, 80]
    assert nice_ticks(5, 5) == [5]


def test_markdown_text_keeps_quotes_and_escapes_html() -> None:
    from cbbench.harness.report.markdown import md_text

    # a warning such as "a worker's timing bound" must read as written on GitHub
    assert md_text("a worker's \"bound\"\n<b>x</b> | `y`") == (
        "a worker's \"bound\" &lt;b&gt;x&lt;/b&gt; \\| 'y'"
    )
