"""`cbbench sim` marks an engine whose batch or step budget lies beyond the steps its hardware
fit measured (`fit.measured_steps`), as `plan` marks its choice: on screen ("EXTRAPOLATED:")
and in the run folder's run.json (`extrapolated`)."""

from __future__ import annotations

import json

import pytest
from cbbench.harness.cli import main
from cbbench.reference_engine.execution.cost_model import get_hardware

from tests.test_calibrate_from_run import SETTINGS, _write_run, measured


@pytest.fixture(scope="module")
def fit(tmp_path_factory):
    root = tmp_path_factory.mktemp("fit")
    _write_run(root / "a1", measured(1.0, 30, 4), SETTINGS)  # budget 256, 8 sequences
    _write_run(root / "a2", measured(3.0, 30, 5), SETTINGS)
    assert main(["calibrate", "--from-run", str(root / "a1"), str(root / "a2"),
                 "--out", str(root / "fit.json")]) == 0  # fmt: skip
    return root / "fit.json"


def _sim(fit, out, seqs: int, budget: int, capsys) -> str:
    capsys.readouterr()
    assert main(["sim", "--hardware", str(fit), "--schedulers", "continuous,static",
                 "--workload", "prompt=64,output=8", "--num-requests", "12",
                 "--max-num-seqs", str(seqs), "--max-num-batched-tokens", str(budget),
                 "--batch-size", "4", "--out", str(out)]) == 0  # fmt: skip
    return capsys.readouterr().out


def test_sim_beyond_the_measured_steps_says_extrapolated(fit, tmp_path, capsys) -> None:
    steps = get_hardware(str(fit)).fit["measured_steps"]
    out = _sim(fit, tmp_path / "far", 32, 4096, capsys)
    line = next(x for x in out.splitlines() if x.startswith("EXTRAPOLATED: continuous: "))
    assert "max_num_batched_tokens 4096 is" in line and "max_num_seqs 32 is" in line
    assert "EXTRAPOLATED: static" not in out  # a batch of 4 is within the measured batches
    meta = json.loads((tmp_path / "far" / "continuous" / "run.json").read_text())
    far = meta["extrapolated"]["max_num_batched_tokens"]
    assert far["value"] == 4096 and far["measured_max"] == steps["max_tokens"]
    assert "extrapolated" not in json.loads((tmp_path / "far" / "static" / "run.json").read_text())


def test_sim_within_the_measured_steps_says_nothing(fit, tmp_path, capsys) -> None:
    steps = get_hardware(str(fit)).fit["measured_steps"]
    out = _sim(fit, tmp_path / "near", steps["max_seqs"], steps["max_tokens"], capsys)
    assert "EXTRAPOLATED" not in out
    meta = json.loads((tmp_path / "near" / "continuous" / "run.json").read_text())
    assert "extrapolated" not in meta


def test_sim_on_a_fit_without_a_range_says_so_once(capsys) -> None:
    assert main(["sim", "--hardware", "cpu-measured", "--schedulers", "continuous", "--model", "tiny",
                 "--workload", "prompt=64,output=8", "--num-requests", "8"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert out.count("records no measured step range") == 1 and "EXTRAPOLATED" not in out
