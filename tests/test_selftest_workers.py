"""`cbbench selftest --workers N`: the error per worker, graded against the server's log,
beside the bound each worker reports; a worker over the limit is said, not hidden."""

import io
import subprocess
import sys

import pytest
from cbbench.harness.cli.selftest import ServerProcess, _verdicts, _within
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.servers.fake_server import Behavior, FakeServerConfig
from cbbench.harness.studies.selftest import measure, timing_errors
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console


def test_measure_reports_the_error_of_each_worker():
    cfg = FakeServerConfig(Behavior(ttft_s=0.02, itl_s=0.005, queue_time_s=None))
    with ServerProcess(cfg, procs=2) as srv:
        m = measure(srv.url, streams=6, workers=2, tokens=5, requests=18, seconds=5.0)
    assert m["failed"] == 0 and m["requests"] == 18
    rows = m["per_worker"]
    assert [w["worker"] for w in rows] == [0, 1]
    assert sum(w["requests"] for w in rows) == 18
    for w in rows:
        for key in ("ttft", "itl"):
            p50, p99 = w[f"{key}_error_ms_p50"], w[f"{key}_error_ms_p99"]
            assert p50 is not None and p50 <= p99
        assert w["bound_ms"] is not None and w["bound_ms"] >= w["send_window_ms_p99"] >= 0
        # timed from the server's send returned, the first chunk's error can only be smaller
        assert w["ttft_written_error_ms_p99"] <= w["ttft_error_ms_p99"]
        assert w["bound_covers_client"] is (w["bound_ms"] >= w["ttft_written_error_ms_p99"])
        over = max(abs(w["ttft_error_ms_p99"]), abs(w["itl_error_ms_p99"])) > w["limit_ms"]
        assert w["error_exceeds"] == over
    assert m["timing_bound_ms"] == max(w["bound_ms"] for w in rows)


def test_requests_fewer_than_streams_still_fill_every_stream():
    with ServerProcess(FakeServerConfig(Behavior(itl_s=0.001, queue_time_s=None))) as srv:
        m = measure(srv.url, streams=12, workers=1, tokens=3, requests=2, seconds=5.0)
    assert m["requests"] == 12


def _row(worker, ttft99, bound):
    return {
        "worker": worker,
        "ttft_error_ms_p99": ttft99,
        "itl_error_ms_p99": 0.01,
        "bound_ms": bound,
        "limit_ms": 1.0,
        "error_exceeds": abs(ttft99) > 1.0,
        "bound_exceeds": bound > 1.0,
    }


def test_a_worker_over_the_limit_is_named():
    fine = {"streams": 64, "workers": 2, "timestamp_source": "kernel"}
    fine["per_worker"] = [_row(0, 0.02, 0.1), _row(1, 0.03, 0.2)]
    late = {"streams": 10000, "workers": 2, "timestamp_source": "kernel"}
    late["per_worker"] = [_row(0, 0.02, 3.5), _row(1, 40.0, 0.2)]
    lines = _verdicts([fine, late])
    assert len(lines) == 1 and "10000 streams" in lines[0] and "worker(s) 0, 1" in lines[0]
    assert [_within(w) for w in late["per_worker"]] == ["NO: bound", "NO: error"]
    assert _within(fine["per_worker"][0]) == "yes"


def test_timing_errors_of_one_worker_are_its_own_records(tmp_path):
    wl = Workload("w", 0, tuple(RequestSpec(i, 4, 4) for i in range(8)))
    cfg = FakeServerConfig(Behavior(itl_s=0.002, queue_time_s=None))
    with ServerProcess(cfg) as srv:
        bench = BenchConfig(
            base_url=srv.url,
            workload=wl,
            concurrency=4,
            workers=2,
            out_dir=tmp_path / "run",
            live=False,
            collect_server_times=True,
        )
        res = run_bench(bench, console=Console(file=io.StringIO()))
    both = timing_errors(res.records)["itl"].size
    per = [timing_errors([r for r in res.records if r.worker == w])["itl"].size for w in (0, 1)]
    assert sum(per) == both == 8 * 3 and all(per)


@pytest.mark.slow
@pytest.mark.timeout(660)  # the command's own bound is 600 s
def test_ten_thousand_streams_over_two_workers_completes_and_reports_each_worker():
    """Bounded: 10,000 requests of 2 tokens, sends stop after 3 s. On 2 cores the error may
    pass the bound; the command must then say EXCEEDED."""
    cmd = [sys.executable, "-m", "cbbench.harness.cli", "selftest", "--streams", "10000"]
    cmd += ["--workers", "2", "--tokens", "2", "--itl-ms", "20", "--seconds", "3"]
    cmd += ["--server-procs", "2", "--stamps", "kernel"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [ln.split("│") for ln in proc.stdout.splitlines() if ln.startswith("│")]
    per_worker = [r for r in rows if len(r) == 16]  # the per-worker table's rows
    assert sorted(r[4].strip() for r in per_worker) == ["0", "1"]
    assert sum(int(r[5]) for r in per_worker) == 10000
    over = [r for r in per_worker if r[14].strip().startswith("NO")]
    assert bool(over) == ("EXCEEDED at 10000 streams" in proc.stdout)
