"""`cbbench bench` / `export` as a user runs them: subprocesses, exit codes, Ctrl-C."""

import json
import signal
import socket
import subprocess
import sys
import time

import pandas as pd
import pytest
from cbbench.harness.results.run_folder import load_run
from servers.fake import Behavior, FakeServerConfig, threaded

CLI = [sys.executable, "-m", "cbbench.harness.cli"]


def _bench(url, out, *extra, **kw):
    args = [*CLI, "bench", "--base-url", url, "--out", str(out), "--no-live"]
    args += ["--no-server-metrics", "--no-gpu-metrics"] if _has_telemetry() else []
    return subprocess.run([*args, *extra], capture_output=True, text=True, timeout=120, **kw)


def _has_telemetry():
    try:
        import cbbench.harness.telemetry  # noqa: F401
    except ImportError:
        return False
    return True


def test_unreachable_server_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _bench(f"http://127.0.0.1:{port}", tmp_path / "r", "--workload", "seed-demo")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "cannot reach server" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--slo", "ttft=soon"], "--slo"),
        (["--concurrency", "0"], "--concurrency"),
        (["--workload", "no-such-preset"], "no-such-preset"),
        (["--extra-body", "[1]"], "--extra-body"),
    ],
)
def test_bad_flags_are_one_line(tmp_path, flags, message):
    proc = _bench("http://127.0.0.1:9", tmp_path / "r", *flags)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_bench_then_export_csv_and_parquet(tmp_path):
    with threaded(FakeServerConfig(Behavior(itl_s=0.001))) as srv:
        proc = _bench(
            srv.url, tmp_path / "r", "--workload", "seed-demo", "--rate", "50",
            "--concurrency", "4", "--slo", "ttft=1s", "--seed", "3",
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "requests/s" in proc.stderr + proc.stdout
    run = load_run(tmp_path / "r")
    m = run.meta
    assert m["schema_version"] == 1 and m["status"] == "complete"
    assert m["workload"]["name"] == "seed-demo" and m["workload"]["seed"] == 3
    assert m["load"]["mode"] == "open" and m["load"]["rate"] == 50
    assert m["environment"]["python"] and m["started_at"] and m["ended_at"]
    assert "bench" in m["command"] and m["summary"]["goodput"]["slo_s"] == {"ttft": 1.0}
    assert sorted(r.output_len for r in run.records) == [3, 5, 6, 8, 10, 12]
    for fmt in ("csv", "parquet"):
        out = tmp_path / f"r.{fmt}"
        p = subprocess.run(
            [*CLI, "export", str(tmp_path / "r"), f"--{fmt}", str(out)],
            capture_output=True,
            text=True,
        )
        assert p.returncode == 0, p.stderr
        df = pd.read_csv(out) if fmt == "csv" else pd.read_parquet(out)
        assert len(df) == 6 and set(df["index"]) == set(range(6))
        assert df["ttft_s"].notna().all()
    # the CSV's ITL lists are the records' own, one gap per streamed token after the first
    by_index = {r.index: r for r in run.records}
    for _, row in pd.read_csv(tmp_path / "r.csv").iterrows():
        rec = by_index[row["index"]]
        itl = json.loads(row["itl_s"])
        assert itl == pytest.approx(rec.itl_s) and len(itl) == len(rec.token_times_s) - 1
        assert len(itl) == rec.output_len - 1 and all(gap >= 0 for gap in itl)


@pytest.mark.parametrize("workers", [1, 2])
def test_sigint_writes_interrupted_run_and_keeps_finished_records(tmp_path, workers):
    out = tmp_path / "r"
    with threaded(FakeServerConfig(Behavior(itl_s=0.05))) as srv:
        args = [*CLI, "bench", "--base-url", srv.url, "--out", str(out), "--no-live"]
        args += ["--workload", "seed-demo", "--concurrency", "2", "--workers", str(workers)]
        args += ["--no-server-metrics", "--no-gpu-metrics"] if _has_telemetry() else []
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # wait for some finished requests
                req = out / "requests.jsonl"
                if req.exists() and len(req.read_text().splitlines()) >= 2:
                    break
                time.sleep(0.05)
            proc.send_signal(signal.SIGINT)
            stdout, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, err
    run = load_run(out)
    assert run.meta["interrupted"] is True and run.meta["status"] == "interrupted"
    n = len(run.records)
    assert 2 <= n < 6
    assert run.meta["summary"]["counts"]["total"] == n
    assert all(r.ok for r in run.records)  # cancelled in-flight requests are not failures
    assert run.meta["summary"]["cancelled_in_flight"] >= 1
    assert run.meta["load"]["workers"] == workers
    # the printed summary says so too (issue 42: it looked like a complete run)
    cancelled = run.meta["summary"]["cancelled_in_flight"]
    assert f"INTERRUPTED (Ctrl-C): the figures above cover the {n} of 6 requests" in stdout
    assert f"{cancelled} cancelled in flight, {6 - n - cancelled} never sent" in stdout
