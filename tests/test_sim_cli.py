"""`cbbench sim` end to end, in-process through the CLI dispatcher."""

from __future__ import annotations

import re

import pytest
from cbbench.harness.cli import main
from cbbench.harness.results.run_folder import load_run


def test_seed_demo_prints_the_timeline(capsys):
    rc = main(["sim", "--workload", "seed-demo", "--batch-size", "4", "--hardware", "steps"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "SIMULATED" in out
    assert "static: 22 steps" in out and "dynamic: 22 steps" in out
    assert "continuous: 15 steps" in out
    assert "slot 3  DDD......." in out  # static: D's slot idles until the batch ends
    assert "slot 3  DDDEEEEEEEEEEEE" in out  # continuous: E takes it at once
    assert "1.47x" in out  # 44 tokens in 15 steps vs 22


def test_out_writes_one_simulated_run_folder_per_scheduler(tmp_path, capsys):
    rc = main(
        ["sim", "--workload", "mixed", "--num-requests", "12", "--batch-size", "4",
         "--out", str(tmp_path), "--scheduler", "static,continuous"]
    )  # fmt: skip
    assert rc == 0
    runs = {name: load_run(tmp_path / name) for name in ("static", "continuous")}
    for name, run in runs.items():
        assert run.meta["simulated"] is True and run.meta["scheduler"] == name
        assert run.meta["hardware"] == "h100-sxm" and run.meta["model"] == "llama-3-8b"
        assert run.meta["workload"]["name"] == "mixed"
        assert len(run.records) == 12
        assert all(r.ttft_s > 0 and r.e2e_s >= r.ttft_s for r in run.records)
        assert all(len(r.token_times_s) == r.output_len for r in run.records)
        assert run.meta["summary"]["counts"]["completed"] == 12
        assert run.meta["summary"]["sim"]["simulated"] is True
        assert run.timeseries and all("kv_usage" in s for s in run.timeseries)
    s, c = (runs[k].meta["summary"] for k in ("static", "continuous"))
    assert c["output_throughput"] > s["output_throughput"]
    assert s["total_output_tokens"] == c["total_output_tokens"]


def test_static_batch_is_shrunk_to_the_kv_pool(capsys):
    rc = main(
        ["sim", "--workload", "uniform", "--num-requests", "4", "--batch-size", "100",
         "--schedulers", "static"]
    )  # fmt: skip
    assert rc == 0
    assert "static: batch size 100 -> 52" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--schedulers", "fifo"], "--schedulers: unknown fifo"),
        (["--hardware", "tpu"], "unknown hardware 'tpu'"),
        (["--workload", "no-such-workload"], "no-such-workload"),
        (["--model", "tiny", "--workload", "heavy-mixed"], "exceeds max_model_len"),
    ],
)
def test_user_errors_are_one_line(argv, message, capsys):
    rc = main(["sim", "--num-requests", "4", *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("cbbench sim: error:") and message in err
    assert len(err.strip().splitlines()) == 1


def test_real_executor_replay_is_labelled_measured(tmp_path, capsys):
    rc = main(
        ["sim", "--executor", "real", "--model", "tiny", "--workload", "seed-demo",
         "--batch-size", "4", "--max-model-len", "128", "--scheduler", "static,continuous",
         "--drain-timeout", "0",
         "--out", str(tmp_path)]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    assert "MEASURED: tiny on cpu (real model)" in out and "SIMULATED" not in out
    assert "static: 22 steps" in out and "continuous: 15 steps" in out
    run = load_run(tmp_path / "continuous")
    assert run.meta["simulated"] is False and run.meta["name"] == "offline-continuous"
    assert sorted(r.output_tokens_server for r in run.records) == [3, 5, 6, 8, 10, 12]


def test_drop_too_long_skips_and_counts(capsys):
    rc = main(
        ["sim", "--model", "tiny", "--workload", "heavy-mixed", "--num-requests", "20",
         "--drop-too-long", "--scheduler", "continuous", "--hardware", "steps"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    skipped = int(out.split("--drop-too-long: skipped ")[1].split()[0])
    assert 0 < skipped < 20
    n = 20 - skipped  # piped output: a Markdown table
    assert re.search(rf"\| requests ok / sent \|( {n}/{n} \|)+", out)


def test_seed_demo_with_no_flag_is_the_seeds_timeline(capsys, monkeypatch):
    """The preset carries the settings it was written for: B = 4, one time unit per step."""
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["sim", "--workload", "seed-demo"]) == 0
    out = capsys.readouterr().out
    assert "static: 22 steps" in out and "continuous: 15 steps" in out
    title = " ".join(out.split())  # the title wraps at the table's width
    assert "B=4" in title and "1 time unit per step" in title


def test_flags_beat_the_preset_settings(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    argv = ["sim", "--workload", "seed-demo", "--batch-size", "2", "--schedulers", "static"]
    assert main(argv) == 0
    assert "B=2" in capsys.readouterr().out


def test_static_never_idles_a_drain_timeout_no_arrival_can_end():
    """6 requests, B = 32, all at once: the batch can never fill, so static runs what waits at
    once instead of idling its 1 s drain timeout (virtual clock: the whole run is < 1 s)."""
    from cbbench.reference_engine.config.options import build_engine_config
    from cbbench.reference_engine.sim.simulate import replay
    from cbbench.workloads import load_workload

    wl = load_workload("seed-demo")
    cfg = build_engine_config(
        {"model": "llama-3-8b", "dtype": "auto", "executor": "sim", "hardware": "h100",
         "batch_size": 32, "drain_timeout": 1.0},
        scheduler="static",
    )  # fmt: skip
    res = replay(wl.requests, cfg)
    assert res.steps[0].start_s == 0.0
    assert res.duration_s < 1.0


def test_title_b_is_the_simulated_schedulers_batch(capsys, monkeypatch):
    """`--schedulers continuous --max-num-seqs 16` titles B=16 (it said the static default,
    B=32); schedulers of different limits name each one."""
    monkeypatch.setenv("COLUMNS", "300")
    argv = ["sim", "--workload", "prompt=64,output=16", "--num-requests", "8", "--max-num-seqs", "16"]
    assert main([*argv, "--schedulers", "continuous"]) == 0
    title = " ".join(capsys.readouterr().out.split())
    assert "B=16 " in title and "B=32" not in title
    assert main([*argv, "--schedulers", "static,continuous"]) == 0
    assert "B=32 (static)/16 (continuous)" in " ".join(capsys.readouterr().out.split())
