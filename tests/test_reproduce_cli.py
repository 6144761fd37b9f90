"""`cbbench reproduce --sim-only`: the seeds' timeline (22 vs 15 steps) and the direction of
the simulated gains (none for uniform lengths, > 1.5x for heavy-mixed)."""

from __future__ import annotations

import json

from cbbench.harness.cli import main
from cbbench.harness.cli.reproduce import scaled_workload
from cbbench.harness.results import load_run


def test_reproduce_sim_only(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich: one table row per line
    out = tmp_path / "rep"
    argv = ["reproduce", "--sim-only", "--num-requests", "48", "--batch-size", "8"]
    assert main([*argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "static: 22 steps" in text and "continuous: 15 steps" in text
    assert "SIMULATED" in text and "about 5.7x" in text and "(--sim-only)" in text
    doc = json.loads((out / "reproduce.json").read_text())
    assert doc["seed_demo_steps"] == {"static": 22, "continuous": 15}
    assert doc["measured_cpu"] is None
    sim = doc["simulated"]
    assert abs(sim["uniform"]["ratio"] - 1.0) < 0.05
    assert sim["heavy-mixed"]["ratio"] > 1.5 and sim["mixed"]["ratio"] > 1.3
    assert sim["heavy-mixed"]["continuous_steps"] < sim["heavy-mixed"]["static_steps"]
    run = load_run(out / "sim" / "heavy-mixed" / "continuous")
    assert run.meta["simulated"] is True and len(run.records) == 48


def test_scaled_workload_divides_lengths():
    wl = scaled_workload("heavy-mixed", 20, 4)
    full = scaled_workload("heavy-mixed", 20, 1)
    assert wl.name == "heavy-mixed/4" and len(wl) == 20
    for a, b in zip(wl.requests, full.requests, strict=True):
        assert a.output_len == max(1, b.output_len // 4)
        assert a.prompt_len == max(1, b.prompt_len // 4)


def test_reproduce_bad_flag(capsys):
    assert main(["reproduce", "--sim-only", "--batch-size", "0"]) == 2
    err = capsys.readouterr().err
    assert "--batch-size must be >= 1" in err and "Traceback" not in err


def test_reproduce_measured_part_on_tiny(tmp_path, capsys, monkeypatch):
    """The CPU half end to end on a very small setting: real engine runs, one table."""
    monkeypatch.setenv("COLUMNS", "200")
    out = tmp_path / "rep"
    argv = ["reproduce", "--num-requests", "16", "--batch-size", "4", "--cpu-model", "tiny"]
    argv += ["--cpu-requests", "4", "--cpu-batch-size", "2", "--cpu-scale", "64"]
    assert main([*argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "MEASURED cpu static" in text and "tiny on CPU, B=2" in text
    doc = json.loads((out / "reproduce.json").read_text())
    cpu = doc["measured_cpu"]
    assert set(cpu) == {"uniform", "mixed", "heavy-mixed"}
    assert all(row["ratio"] and row["ratio"] > 0 for row in cpu.values())
    # same requests, fewer or equal steps for continuous (it never waits for a whole batch)
    assert all(row["continuous_steps"] <= row["static_steps"] for row in cpu.values())
    run = load_run(out / "cpu" / "heavy-mixed_64" / "static")
    assert run.meta["simulated"] is False and len(run.records) == 4
