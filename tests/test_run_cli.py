"""`cbbench run` end to end: real servers (tiny model, CPU) per scheduler, load over HTTP,
run folders, the side-by-side table and the HTML report; `--sim`; flag forwarding; errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cbbench.harness.cli import build_parser, main
from cbbench.harness.cli.run import run_options
from cbbench.harness.results.run_folder import load_run
from cbbench.harness.studies.run_demo import RUN_WORKLOAD, serve_settings
from cbbench.reference_engine.config.options import (
    build_engine_config,
    engine_argv,
    engine_config_from_args,
)
from cbbench.workloads import load_workload


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_run_two_schedulers_end_to_end(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich: one table row per line
    out = tmp_path / "demo"
    argv = ["run", "--workload", "seed-demo", "--num-requests", "4", "--batch-size", "2"]
    argv += ["--schedulers", "static,continuous", "--device", "cpu", "--no-live"]
    assert main([*argv, "--out", str(out)]) == 0
    cap = capsys.readouterr()
    text = cap.out
    # issue 51: the timing bound is judged once over the runs, never a banner per scheduler
    assert "TIMING BOUND" not in cap.err and text.count("timing: ") <= 1
    for name in ("static", "continuous"):
        run = load_run(out / name)
        assert run.meta["status"] == "complete"
        assert run.meta["target"]["scheduler"] == name  # the server said which policy ran
        # one unmeasured request warms each fresh server first (a cold one streamed every
        # token of its first requests in one burst: TPOT p50 0.0 ms)
        assert [r.warmup for r in run.records].count(True) == 1
        assert run.meta["summary"]["counts"]["warmup_excluded"] == 1
        measured = [r for r in run.records if not r.warmup]
        assert len(measured) == 4 and all(r.ok for r in run.records)
        assert [r.output_tokens_server for r in sorted(measured, key=lambda r: r.index)] == [
            10,
            5,
            8,
            3,
        ]
        # telemetry was on: the server's gauges were scraped into the time series
        assert any(s.get("source") == "server" for s in run.timeseries)
        assert "server" in run.meta["summary"]["telemetry"]
        assert "--batch-size" in run.meta["load"]["engine_flags"] or name != "static"
    html = (out / "report.html").read_text()
    assert "static" in html and "continuous" in html and "<svg" in html
    assert "output tok/s vs static" in text and "E2E p99 (ms)" in text
    assert "batch occupancy" in text and "KV usage" in text
    assert "partial batch waits --drain-timeout (1s)" in text  # the table says why static idles
    assert (out / "comparison.md").read_text().count("| E2E p99 (ms) |") == 1
    assert f"report: {out / 'report.html'}" in text
    assert not (out / "dynamic").exists()
    # issue 42: a run this small cannot show the schedulers apart, and says so
    caution = "caution: 4 requests are 2 batches of B=2: too few to show the schedulers apart"
    assert text.count(caution) == 2  # before the runs and beside the table
    # whole lines, however narrow the output (it wrapped mid-phrase at the console's width)
    whole = [x for x in text.splitlines() if x.startswith(caution) and x.rstrip().endswith(")")]
    assert len(whole) == 2, text


def test_run_sim_is_labelled_and_writes_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    out = tmp_path / "sim"
    argv = ["run", "--sim", "steps", "--workload", "seed-demo", "--batch-size", "4"]
    assert main([*argv, "--schedulers", "static,continuous", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "SIMULATED" in text
    assert "22 steps" in text and "15 steps" in text  # the seed demo's timeline
    for name in ("static", "continuous"):
        meta = load_run(out / name).meta
        assert meta["simulated"] is True
    assert "SIMULATED" in (out / "report.html").read_text()


def test_default_workload_spec_is_written_and_loads(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps(RUN_WORKLOAD))
    wl = load_workload(str(path))
    assert len(wl) == RUN_WORKLOAD["num_requests"] and wl.name == "run-demo"
    outs = [r.output_len for r in wl.requests]
    assert min(outs) >= 8 and max(outs) <= 1024 and max(outs) > 4 * min(outs)  # mixed


def test_engine_flags_forward_what_was_given():
    p = build_parser()
    args = p.parse_args(
        ["run", "--batch-size", "3", "--block-size", "8", "--no-enable-chunked-prefill"]
        + ["--preferred-batch-sizes", "1,3", "--enable-prefix-caching", "--max-num-seqs", "5"]
        + ["--aging-rate", "0.5", "--kv-cache-memory-gb", "0.25"]
    )
    opts = run_options(args)
    static = engine_argv(serve_settings(opts, "static"))
    assert static[static.index("--batch-size") + 1] == "3"
    assert static[static.index("--block-size") + 1] == "8"
    assert "--no-enable-chunked-prefill" in static and "--enable-prefix-caching" in static
    assert static[static.index("--preferred-batch-sizes") + 1] == "1,3"
    assert static[static.index("--aging-rate") + 1] == "0.5"
    assert static[static.index("--kv-cache-memory-gb") + 1] == "0.25"
    # what each server builds from those flags: B for dynamic, the explicit flag for continuous
    for name, slots in (("static", 3), ("dynamic", 3), ("continuous", 5)):
        sp = build_parser().parse_args(["serve", *engine_argv(serve_settings(opts, name))])
        cfg = engine_config_from_args(sp, scheduler=name)
        assert cfg.max_batch_slots == slots, name
        assert cfg == build_engine_config(serve_settings(opts, name), scheduler=name)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--schedulers", "static,fast"], "--schedulers: unknown fast"),  # the flag typed
        (["--scheduler", "static,fast"], "--scheduler: unknown fast"),
        (["--batch-size", "0"], "--batch-size"),
        (["--slo", "ttft=soon"], "--slo"),
        (["--workload", "no-such-workload"], "no-such-workload"),
    ],
)
def test_run_bad_input_is_one_line(tmp_path, capsys, argv, needle):
    assert main(["run", *argv, "--out", str(tmp_path / "x"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    lines = [ln for ln in err.splitlines() if ": note: " not in ln]  # an old spelling's note
    assert needle in err and "Traceback" not in err and len(lines) == 1
    assert ("--scheduler is the old spelling" in err) == ("--scheduler" in argv)
    assert not (tmp_path / "x").exists()  # nothing written for a run that never started


def test_run_that_fails_to_start_leaves_no_folder(tmp_path, capsys):
    """Issue 51: a server that cannot start (CUDA asked of a CPU torch) fails the run in one
    line, and the folder made for it (which held only workload.json) is gone."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: the server would start")
    out = tmp_path / "x"
    assert main(["run", "--device", "cuda", "--num-requests", "4", "--out", str(out)]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert "CUDA is not available" in err and len(err.splitlines()) == 1
    assert not out.exists()
    # piped, the opening line stays whole (it wrapped at 80 columns mid-phrase)
    assert any(
        line.startswith("cbbench run: 4 requests of run-demo against the reference engine")
        and line.endswith(f"once per scheduler: static, dynamic, continuous; results in {out}")
        for line in cap.out.splitlines()
    ), cap.out


def test_run_demo_is_a_workload_name(tmp_path):
    """`run-demo`, the name `cbbench run` prints and records, is a workload every command takes."""
    from cbbench.workloads import load_workload

    wl = load_workload("run-demo", seed=0, num_requests=8)
    assert wl.name == "run-demo" and len(wl) == 8
    assert RUN_WORKLOAD["num_requests"] == 256 and RUN_WORKLOAD["name"] == "run-demo"


def test_run_ctrl_c_keeps_finished_requests(tmp_path):
    """SIGINT mid-run: the finished requests stay in the run folder, later schedulers are
    skipped, the report of what finished is written, exit 130."""
    import os
    import signal
    import subprocess
    import sys
    import time

    spec = tmp_path / "long.json"
    spec.write_text(json.dumps({"num_requests": 12, "prompt": 16, "output": 300}))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "cbbench.harness.cli", "run", "--workload", str(spec)]
    cmd += ["--batch-size", "1", "--schedulers", "static,continuous", "--device", "cpu"]
    cmd += ["--no-live", "--out", str(out)]
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    records = out / "static" / "requests.jsonl"
    deadline = time.monotonic() + 90
    try:
        while not (records.exists() and records.read_text().count("\n") >= 1):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no request finished in time"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr[-2000:]
    run = load_run(out / "static")
    assert run.meta["status"] == "interrupted"
    ok = [r for r in run.records if r.ok]
    assert 1 <= len(ok) < 12 and all(r.output_tokens_server == 300 for r in ok)
    assert not (out / "continuous").exists()
    assert (out / "report.html").is_file() and "interrupted" in stdout


def test_a_presets_own_batch_size_is_the_default_b(tmp_path, capsys, monkeypatch):
    """seed-demo was written for B = 4: `run` uses it on both paths unless --batch-size says
    otherwise."""
    monkeypatch.setenv("COLUMNS", "200")
    opts = run_options(build_parser().parse_args(["run", "--workload", "seed-demo"]))
    assert serve_settings(opts, "static")["batch_size"] == 4
    opts = run_options(build_parser().parse_args(["run", "--workload", "mixed"]))
    assert serve_settings(opts, "static")["batch_size"] == 8
    argv = ["run", "--sim", "steps", "--workload", "seed-demo", "--schedulers", "static"]
    assert main([*argv, "--out", str(tmp_path / "s"), "--no-report"]) == 0
    assert "B=4" in capsys.readouterr().out


def test_run_started_with_sigint_ignored_stops_on_sigint(tmp_path):
    """`cbbench run &` from a script starts with SIGINT ignored (the shell's rule for background
    jobs); `kill -INT` still stops it, as it stops `bench`: here while its first server starts."""
    import os
    import signal
    import subprocess
    import sys

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "cbbench.harness.cli", "run", "--workload", "prompt=16,output=8"]
    cmd += ["--num-requests", "4", "--batch-size", "2", "--schedulers", "static,continuous"]
    cmd += ["--device", "cpu", "--no-live", "--no-report", "--out", str(out)]
    env = {**os.environ, "COLUMNS": "200"}
    ignore = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, preexec_fn=ignore)  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # bounded: the process ends
            if "starting cbbench serve" in line:
                proc.send_signal(signal.SIGINT)
                break
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 130, (stdout[-1000:], stderr[-2000:])
    assert "interrupted" in stdout and not (out / "continuous").exists()
