"""`cbbench sweep` against the scripted OpenAI server on 127.0.0.1: levels, folder, report,
early stop on over-saturation, bad flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cbbench.harness.cli import main
from cbbench.harness.report import build_report
from cbbench.harness.results.run_folder import load_run
from cbbench.harness.sweep.levels import SaturationWatch, auto_rates
from servers.fake import Behavior, FakeServerConfig, threaded

FAST = Behavior(ttft_s=0.005, itl_s=0.0, tokens_per_chunk=64)
COMMON = ["--workload", "seed-demo", "--num-requests", "12", "--no-live"]
COMMON += ["--no-server-metrics", "--no-gpu-metrics"]


def test_auto_sweep_writes_levels_in_load_order_and_reports_curves(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    with threaded(FakeServerConfig(default=FAST)) as srv:
        argv = ["sweep", "--base-url", srv.url, "--auto", "--between", "2", "--out", str(out)]
        assert main([*argv, *COMMON]) == 0
    index = json.loads((out / "sweep.json").read_text())
    assert index["status"] == "complete" and index["mode"] == "auto"
    names = index["runs"]
    assert names[0] == "sync" and names[-1] == "max" and len(names) == 4
    rates = [lv["rate"] for lv in index["levels"][1:-1]]
    sync_rps, max_rps = (index["levels"][i]["request_throughput"] for i in (0, -1))
    assert sync_rps < rates[0] < rates[1] < max_rps  # geometric levels in between
    for name in names:
        run = load_run(out / name)
        assert len([r for r in run.records if r.ok]) == 12
        assert run.meta["load"]["sweep_level"] == name
    assert load_run(out / "sync").meta["load"]["concurrency"] == 1
    rep = build_report([out])
    assert [lr.label for lr in rep.runs] == [f"sweep/{n}" for n in names]
    assert "TTFT vs throughput" in rep.html()


def test_rates_and_concurrency_lists(tmp_path: Path) -> None:
    with threaded(FakeServerConfig(default=FAST)) as srv:
        base = ["sweep", "--base-url", srv.url, *COMMON]
        assert main([*base, "--rates", "40,20", "--out", str(tmp_path / "r")]) == 0
        assert main([*base, "--concurrency", "1,3", "--out", str(tmp_path / "c")]) == 0
    r = json.loads((tmp_path / "r" / "sweep.json").read_text())
    assert r["runs"] == ["rate-20", "rate-40"]
    assert [lv["rate"] for lv in r["levels"]] == [20.0, 40.0]
    c = json.loads((tmp_path / "c" / "sweep.json").read_text())
    assert c["runs"] == ["concurrency-1", "concurrency-3"]
    assert load_run(tmp_path / "c" / "concurrency-3").meta["load"]["concurrency"] == 3


def test_exploding_latency_stops_the_level_early(tmp_path: Path) -> None:
    n = 60
    # request i waits 0.03 * i s before its first token: TTFT grows without bound
    rules = {i: Behavior(ttft_s=0.03 * i, tokens_per_chunk=64) for i in range(n)}
    out = tmp_path / "sat"
    with threaded(FakeServerConfig(default=FAST, rules=rules)) as srv:
        argv = ["sweep", "--base-url", srv.url, "--concurrency", "4", "--out", str(out)]
        argv += ["--workload", "uniform", "--num-requests", str(n)]
        assert main([*argv, "--no-live", "--no-server-metrics", "--no-gpu-metrics"]) == 0
    lv = json.loads((out / "sweep.json").read_text())["levels"][0]
    assert lv["stopped_early"].startswith("over-saturated: TTFT exploding")  # not "Ctrl-C"
    assert not lv["interrupted"]
    run = load_run(out / "concurrency-4")
    assert 20 <= len(run.records) < n  # stopped, with every finished request kept
    watch = run.meta["summary"]["telemetry"]["saturation"]["stopped_early"]
    assert lv["stopped_early"] == f"over-saturated: {watch}"
    assert run.meta["status"] == "stopped-early"


def test_watch_reads_growing_waiting_queue(tmp_path: Path) -> None:
    lines = [{"t_s": i * 0.25, "waiting": float(i)} for i in range(30)]
    (tmp_path / "timeseries.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    watch = SaturationWatch(tmp_path, total=100, timeout_s=60)
    watch._read()
    assert watch.verdict() == "server waiting queue growing: 9 -> 20 requests"
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "timeseries.jsonl").write_text(
        "".join(json.dumps({"waiting": 3.0}) + "\n" for _ in lines)
    )
    steady = SaturationWatch(flat, total=100, timeout_s=60)
    steady._read()
    assert steady.verdict() is None


def test_auto_rates() -> None:
    assert auto_rates(1.0, 16.0, 3) == pytest.approx([2.0, 4.0, 8.0])
    assert auto_rates(5.0, 5.1, 3) == []  # no room between synchronous and max


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--rates", "1,x"], "--rates: '1,x' is not a comma list"),
        (["--rates", "0,2"], "--rates: give positive numbers"),
        (["--concurrency", "2,2"], "repeats a level"),
        (["--rates", "1,2,3", "--max-levels", "2"], "3 levels, more than --max-levels 2"),
    ],
)
def test_bad_flags_exit_2(tmp_path: Path, capsys, flags: list[str], message: str) -> None:
    argv = ["sweep", "--base-url", "http://127.0.0.1:9", "--out", str(tmp_path / "s"), *flags]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_existing_sweep_folder_is_refused(tmp_path: Path, capsys) -> None:
    (tmp_path / "sweep.json").write_text("{}")
    argv = ["sweep", "--base-url", "http://127.0.0.1:9", "--rates", "1", "--out", str(tmp_path)]
    assert main(argv) == 2
    assert "already holds a sweep" in capsys.readouterr().err


def test_ctrl_c_stops_the_sweep_and_keeps_finished_requests(tmp_path: Path) -> None:
    import os
    import signal
    import threading

    out = tmp_path / "int"
    slow = Behavior(ttft_s=0.05, tokens_per_chunk=64)
    with threaded(FakeServerConfig(default=slow)) as srv:
        argv = ["sweep", "--base-url", srv.url, "--concurrency", "1,2", "--out", str(out)]
        argv += ["--workload", "uniform", "--num-requests", "40"]
        done = threading.Event()

        def ctrl_c_after_three_requests() -> None:  # as a user would, mid-level
            log = out / "concurrency-1" / "requests.jsonl"
            while not done.wait(0.02):
                if log.exists() and log.read_text().count("\n") >= 3:
                    os.kill(os.getpid(), signal.SIGINT)
                    return

        watcher = threading.Thread(target=ctrl_c_after_three_requests, daemon=True)
        watcher.start()
        try:
            rc = main([*argv, "--no-live", "--no-server-metrics", "--no-gpu-metrics"])
        finally:
            done.set()
            watcher.join(5)
    assert rc == 130
    index = json.loads((out / "sweep.json").read_text())
    assert index["status"] == "interrupted"
    assert index["runs"] == ["concurrency-1"]  # the second level never started
    assert index["levels"][0]["interrupted"] is True
    run = load_run(out / "concurrency-1")
    assert 0 < len(run.records) < 40 and run.meta["interrupted"] is True
