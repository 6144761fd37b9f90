"""`cbbench calibrate` on the tiny model: measured grid -> fitted hardware JSON -> simulator."""

from __future__ import annotations

import json

from cbbench.harness.cli import main
from cbbench.reference_engine.cost_model import LINEAR_TERMS, get_hardware


def test_calibrate_writes_a_fit_the_simulator_uses(tmp_path, capsys):
    out = tmp_path / "cpu.json"
    rc = main(
        ["calibrate", "--model", "tiny", "--batch-sizes", "1,4", "--context-lens", "16,64",
         "--prefill-lens", "16", "--repeats", "2", "--min-time", "0", "--threads", "1", "--out", str(out)]
    )  # fmt: skip
    text = capsys.readouterr().out
    assert rc == 0
    assert "fit error: mean" in text and "measured vs fitted" in text
    spec = get_hardware(str(out))
    assert spec.linear is not None and set(spec.linear) == set(LINEAR_TERMS)
    assert all(v >= 0 for v in spec.linear.values()) and any(v > 0 for v in spec.linear.values())
    assert spec.fit["points"] == 5 and spec.fit["model"] == "tiny"
    assert json.loads(out.read_text())["name"] == "measured-tiny-cpu"
    rc = main(
        ["sim", "--model", "tiny", "--hardware", str(out), "--workload", "chat",
         "--num-requests", "8", "--batch-size", "4", "--max-model-len", "2048"]
    )  # fmt: skip
    assert rc == 0
    assert "SIMULATED: tiny on measured-tiny-cpu" in capsys.readouterr().out


def test_calibrate_rejects_bad_grids(capsys):
    assert main(["calibrate", "--model", "tiny", "--batch-sizes", "0,4"]) == 2
    assert "--batch-sizes: expected positive integers" in capsys.readouterr().err
    assert main(["calibrate", "--model", "tiny", "--context-lens", "99999"]) == 2
    assert "exceeds the model's 2048" in capsys.readouterr().err
