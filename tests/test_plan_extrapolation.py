"""`cbbench plan` marks a configuration whose step budget or batch lies beyond the steps the
hardware fit measured (harness/planning/extrapolation.py): a `calibrate --from-run` fit
records the largest step and batch of its runs' replay (sim/step_range.py), and a plan with
that fit says, on screen and in plan.json, which setting is outside and by how far."""

from __future__ import annotations

import json

from cbbench.harness.cli import main
from cbbench.harness.planning.extrapolation import describe, outside
from cbbench.reference_engine.execution.cost_model import get_hardware

from tests.test_calibrate_from_run import SETTINGS, _write_run, measured


def test_outside_names_each_setting_above_the_measured_range() -> None:
    fit = {"measured_steps": {"max_tokens": 400, "max_seqs": 8, "steps": 90}}
    cont = {"scheduler": "continuous", "max_num_seqs": 16, "max_num_batched_tokens": 2048}
    got = outside(cont, fit)
    assert got == {"max_num_seqs": {"value": 16, "measured_max": 8, "times": 2.0},
                   "max_num_batched_tokens": {"value": 2048, "measured_max": 400,
                                              "times": 5.12}}  # fmt: skip
    assert describe(got) == ("max_num_seqs 16 is 2x the largest batch the fit measured (8 "
                             "sequences); max_num_batched_tokens 2048 is 5.12x the largest step "
                             "the fit measured (400 tokens)")  # fmt: skip
    assert outside({**cont, "max_num_seqs": 8, "max_num_batched_tokens": 400}, fit) == {}
    # static batching has no token budget; a fit that records no range marks nothing
    assert set(outside({**cont, "scheduler": "static"}, fit)) == {"max_num_seqs"}
    assert outside(cont, {"model": "small"}) == {} and outside(cont, None) == {}


def test_plan_with_a_from_run_fit_marks_a_budget_it_never_measured(tmp_path, capsys) -> None:
    _write_run(tmp_path / "a1", measured(1.0, 30, 4), SETTINGS)  # budget 256, 8 sequences
    _write_run(tmp_path / "a2", measured(3.0, 30, 5), SETTINGS)
    fit = tmp_path / "fit.json"
    assert main(["calibrate", "--from-run", str(tmp_path / "a1"), str(tmp_path / "a2"),
                 "--out", str(fit)]) == 0  # fmt: skip
    steps = get_hardware(str(fit)).fit["measured_steps"]
    assert 0 < steps["max_tokens"] <= 256 and 0 < steps["max_seqs"] <= 8  # the server's limits
    capsys.readouterr()
    # two budgets at one cost: the measured one is chosen; a larger batch only beyond it
    rc = main(["plan", "--rate", "1", "--slo", "ttft_p99=30s", "--hardware", str(fit),
               "--price", "1", "--num-requests", "40", "--workload", "prompt=64,output=16",
               "--space", "replicas=1-1;max_num_seqs=8;max_num_batched_tokens=256,4096",
               "--out", str(tmp_path / "plan")])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    doc = json.loads((tmp_path / "plan" / "plan.json").read_text())
    by_budget = {p["config"]["max_num_batched_tokens"]: p for p in doc["points"]}
    assert by_budget[256]["extrapolated"] == {}
    far = by_budget[4096]["extrapolated"]["max_num_batched_tokens"]
    assert far["measured_max"] == steps["max_tokens"] and far["times"] > 4096 / 256 - 0.01
    assert doc["chosen"]["config"]["max_num_batched_tokens"] == 256
    assert "EXTRAPOLATED" not in out

    # only a budget beyond the fit's steps: chosen, and said so on screen and in plan.json
    capsys.readouterr()
    rc = main(["plan", "--rate", "1", "--slo", "ttft_p99=30s", "--hardware", str(fit),
               "--price", "1", "--num-requests", "40", "--workload", "prompt=64,output=16",
               "--space", "replicas=1-1;max_num_seqs=32;max_num_batched_tokens=4096",
               "--out", str(tmp_path / "plan2")])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    line = next(x for x in out.splitlines() if x.startswith("EXTRAPOLATED: "))
    assert "max_num_batched_tokens 4096 is" in line and "max_num_seqs 32 is" in line
    chosen = json.loads((tmp_path / "plan2" / "plan.json").read_text())["chosen"]
    assert set(chosen["extrapolated"]) == {"max_num_seqs", "max_num_batched_tokens"}
    assert "EXTRAPOLATED:" in (tmp_path / "plan2" / "plan.html").read_text()


def test_a_fit_without_a_range_says_so_once(tmp_path, capsys) -> None:
    rc = main(["plan", "--rate", "1", "--slo", "ttft_p99=30s", "--hardware", "cpu-measured",
               "--price", "1", "--num-requests", "20", "--workload", "prompt=64,output=16",
               "--space", "replicas=1-1;max_num_seqs=8;max_num_batched_tokens=512"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0 and out.count("records no measured step range") == 1
    assert "EXTRAPOLATED" not in out
