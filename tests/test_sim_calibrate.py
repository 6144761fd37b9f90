"""`cbbench calibrate` on the tiny model: engine step trace -> fitted hardware JSON ->
simulator; `--validate` compares simulated and real runs of a held-out workload."""

from __future__ import annotations

import json

import pytest
from cbbench.harness.cli import main
from cbbench.reference_engine.execution.cost_model import STEP_TERMS, get_hardware
from cbbench.reference_engine.sim.calibration import TracedClock, calibrate, fit_workloads


def test_calibrate_then_validate_writes_a_fit_the_simulator_uses(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    out = tmp_path / "cpu.json"
    argv = ["calibrate", "--model", "tiny", "--scale", "0.05", "--clock", "cpu", "--out", str(out)]
    held = ["--validate-workloads", "chat,uniform", "--validate-requests", "2"]
    assert main([*argv, "--validate", *held]) == 0
    text = capsys.readouterr().out
    assert "measured engine steps" in text and "decode only" in text
    assert "held-out validation: SIMULATED (measured-tiny-cpu) vs MEASURED" in text
    assert "held-out validation: WITHIN" in text or "held-out validation: OUTSIDE" in text
    spec = get_hardware(str(out))
    assert spec.linear is not None and set(spec.linear) == set(STEP_TERMS)
    assert all(v >= 0 for v in spec.linear.values()) and any(v > 0 for v in spec.linear.values())
    assert spec.linear["c_host"] + spec.linear["c_seq"] > 0  # host work, fitted on the host part
    assert spec.fit["model"] == "tiny" and spec.fit["clock"] == "cpu" and spec.fit["points"] > 20
    assert 0 < spec.fit["speed_drift"][0] <= 1 <= spec.fit["speed_drift"][1]
    rows = spec.fit["validation"]["rows"]
    assert [(r["workload"], r["scheduler"]) for r in rows] == [
        ("chat", "static"), ("chat", "continuous"), ("uniform", "static"),
        ("uniform", "continuous"),
    ]  # fmt: skip
    assert spec.fit["validation"]["workloads"] == {
        "chat": {"num_requests": 2, "batch_size": 8},
        "uniform": {"num_requests": 8, "batch_size": 4},
    }
    for r in rows:
        assert r["sim_output_tok_s"] > 0 and r["real_output_tok_s"] > 0
        assert r["throughput_error"] == pytest.approx(
            r["sim_output_tok_s"] / r["real_output_tok_s"] - 1
        )
    assert json.loads(out.read_text())["name"] == "measured-tiny-cpu"
    rc = main(
        ["sim", "--model", "tiny", "--hardware", str(out), "--workload", "chat",
         "--num-requests", "8", "--batch-size", "4", "--max-model-len", "2048"]
    )  # fmt: skip
    assert rc == 0
    assert "SIMULATED: tiny on measured-tiny-cpu" in capsys.readouterr().out


def test_fit_durations_sum_to_the_traced_run():
    """Every step is traced, and the fitted model reproduces the fit runs' summed time."""
    cal = calibrate("tiny", clock="cpu", scale=0.05, log=lambda s: None)
    steps = sum(len(f.requests) for f in fit_workloads(0.05))
    assert len(cal.works) >= steps  # at least one step per request (its prefill)
    assert sum(cal.predicted_s) == pytest.approx(sum(cal.measured_s), rel=0.02)
    # the range it measured, which `plan` marks configurations beyond (planning/extrapolation)
    assert cal.spec.fit["measured_steps"] == {
        "max_tokens": max(w.num_tokens for w in cal.works),
        "max_seqs": max(w.num_seqs for w in cal.works), "steps": len(cal.works)}  # fmt: skip


def test_traced_clock_idles_virtually_and_rejects_bad_clocks():
    class Inner:
        def execute(self, chunks):
            return []

    t = TracedClock(Inner(), cost=None, clock="wall")  # type: ignore[arg-type]
    before = t.now()
    t.advance_to(before + 100.0)
    assert t.now() >= before + 100.0
    from cbbench.reference_engine.errors import EngineError

    with pytest.raises(EngineError, match="clock must be one of wall, cpu"):
        TracedClock(Inner(), cost=None, clock="gpu")  # type: ignore[arg-type]


def test_calibrate_rejects_bad_flags(capsys):
    assert main(["calibrate", "--model", "tiny", "--scale", "0"]) == 2
    assert "--scale must be > 0" in capsys.readouterr().err
    assert main(["calibrate", "--model", "tiny", "--fit", "cpu-measured"]) == 2
    assert "--fit only goes with --validate" in capsys.readouterr().err
    assert main(["calibrate", "--validate", "--fit", "h100"]) == 2
    assert "not a fitted (linear) hardware" in capsys.readouterr().err
    assert main(["calibrate", "--validate", "--validate-workloads", "chat,nope"]) == 2
    assert "held-out workload 'nope': not one of chat, uniform" in capsys.readouterr().err


def test_interleaved_runs_each_keep_their_own_clock():
    """Two real engines stepped in turn: each clock runs only while its engine does, and
    each run schedules exactly as it would alone."""
    from cbbench.reference_engine.sim.calibration import engine_config, run_interleaved
    from cbbench.reference_engine.sim.simulate import replay
    from cbbench.workloads.spec import RequestSpec

    reqs = [RequestSpec(i, 8 + 4 * i, 6 + 3 * i) for i in range(4)]
    jobs = [
        (reqs, engine_config("tiny", s, 2, 64, "real", "h100", "float32"))
        for s in ("static", "continuous")
    ]
    out = run_interleaved(jobs, "wall")
    for (_, cfg), (res, steps, host) in zip(jobs, out, strict=True):
        alone = replay(reqs, cfg)
        assert len(res.steps) == len(alone.steps) == len(steps)
        assert [r.output_token_ids for r in res.requests] == [
            r.output_token_ids for r in alone.requests
        ]
        traced = sum(d for _, d in steps)
        assert 0 < traced <= res.duration_s < 1.5 * traced  # the other engine's time excluded
        assert len(host) == len(steps) and all(
            0 <= h <= d for h, (_, d) in zip(host, steps, strict=True)
        )
