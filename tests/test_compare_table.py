"""One summary type and one comparison table for sim and measured runs; Markdown when piped."""

from __future__ import annotations

import io

from cbbench.harness.results.compare import comparison_table, emit_table, markdown
from cbbench.harness.studies.simulation import run_summary
from cbbench.reference_engine.config.options import build_engine_config
from cbbench.reference_engine.sim.simulate import replay
from cbbench.workloads import load_workload
from rich.console import Console


def _sim_summaries() -> dict[str, dict]:
    wl = load_workload("seed-demo")
    out = {}
    for name in ("static", "continuous"):
        cfg = build_engine_config(
            {"executor": "sim", "hardware": "steps", "batch_size": 4, "model": "tiny"},
            scheduler=name,
        )
        out[name] = run_summary(replay(wl.requests, cfg), name)
    return out


def test_a_replay_summary_is_the_run_summary_type():
    s = _sim_summaries()["continuous"]
    # the harness's summary keys, not the engine's own spelling
    assert s["counts"]["total"] == s["counts"]["completed"] == 6
    assert set(s["e2e_s"]) == {"mean", "p50", "p90", "p95", "p99", "max", "count"}
    assert s["server_queue_s"]["count"] == 6
    assert s["sim"]["num_steps"] == 15 and s["total_output_tokens"] == 44
    # the engine's own summary uses the same percentile helper
    assert set(s["sim"]["e2e_s"]) == set(s["e2e_s"])
    assert s["sim"]["e2e_s"]["p99"] == s["e2e_s"]["p99"]


def test_markdown_keeps_every_name_whole_and_is_written(tmp_path):
    summaries = _sim_summaries()
    long = "continuous-with-a-very-long-name"
    summaries[long] = summaries.pop("continuous")
    table = comparison_table(summaries, "seed demo", steps=True)
    console = Console(file=io.StringIO(), width=40)  # narrow and not a terminal
    path = emit_table(console, table, tmp_path)
    text = console.file.getvalue()
    assert long in text and "output tok/steps vs static" in text
    assert "| engine steps | 22 | 15 |" in text and "| requests ok / sent | 6/6 | 6/6 |" in text
    assert path == tmp_path / "comparison.md" and path.read_text() == markdown(table)


def test_measured_summaries_read_the_servers_telemetry():
    s = dict(_sim_summaries()["static"])
    s.pop("sim")
    s["telemetry"] = {
        "server": {"batch_occupancy": {"mean": 0.5}, "kv_usage": {"mean": 0.25, "max": 0.5}}
    }
    text = markdown(comparison_table({"static": s}, "t"))
    assert (
        "| batch occupancy (mean) | 50% |" in text and "| KV usage mean / max | 25% / 50% |" in text
    )
    assert "engine steps" not in text


def test_the_summary_type_names_every_key_summarize_writes():
    """RunSummary (the typed form of run.json's summary) covers what summarize and a replay
    write, and Stats is exactly the percentile helper's output."""
    from cbbench.harness.results.summary import Counts, RunSummary, Stats

    s = _sim_summaries()["static"]
    assert set(s) <= set(RunSummary.__annotations__)
    assert set(s["counts"]) <= set(Counts.__annotations__)
    assert set(s["ttft_s"]) == set(Stats.__annotations__)


def test_a_run_cut_by_ctrl_c_counts_against_what_it_planned():
    """`cbbench run` cut midway printed "requests ok / sent 89/89" for 89 of 256."""
    summaries = _sim_summaries()
    summaries["static"]["interrupted_of"] = 10
    out = io.StringIO()
    Console(file=out, width=200).print(comparison_table(summaries, "t"))
    row = next(ln for ln in out.getvalue().splitlines() if "requests ok / sent" in ln)
    assert "6/10 (Ctrl-C)" in row and "6/6" in row  # continuous: not cut
