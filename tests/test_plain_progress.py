"""Piped output stays readable (issue 42, finding 10, first half): a run whose output is not a
terminal (CI logs) prints plain progress lines while it goes instead of nothing until the end,
and the notes under the summary table are whole left-aligned lines, not a centred caption
wrapped mid-phrase."""

from __future__ import annotations

import io
import time

import pytest
from cbbench.harness.cli import main
from cbbench.harness.console import live, progress
from cbbench.harness.console.progress import request_progress, step_progress
from rich.console import Console
from servers.fake import Behavior, FakeServerConfig, threaded


# serial: its worker line ends in ms unless a busy core stalled the client
@pytest.mark.serial
def test_piped_bench_prints_progress_lines_and_whole_footer_lines(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(live, "PLAIN_EVERY_S", 0.3)
    # 12 requests, one at a time, 0.15 s each: about 1.8 s of run
    slow = Behavior(ttft_s=0.05, itl_s=0.01, tokens_per_chunk=1)
    with threaded(FakeServerConfig(default=slow)) as srv:
        argv = ["bench", "--base-url", srv.url, "--workload", "seed-demo", "--num-requests",
                "12", "--concurrency", "1", "--out", str(tmp_path / "r"), "--no-server-metrics",
                "--no-gpu-metrics"]  # fmt: skip
        assert main(argv) == 0
    cap = capsys.readouterr()
    printed = cap.out + cap.err
    lines = [ln for ln in printed.splitlines() if ln.startswith("progress ")]
    assert len(lines) >= 2, printed  # while it ran, not only at the end
    assert "done " in lines[-1] and "/12, failed 0" in lines[-1] and "tok/s" in lines[-1]
    # the footer: each note one whole line from the left margin (a caption centred them and
    # wrapped them at the table's width)
    completed = next(ln for ln in printed.splitlines() if "completed 12" in ln)
    assert completed.startswith("completed 12") and "warmup excluded 0" in completed
    conn = next(ln for ln in printed.splitlines() if ln.startswith("connections: opened"))
    assert len(conn) > 80 and conn.rstrip().endswith("stamps")  # longer than the table: whole
    # the worker timing line and the outcome notes too (they wrapped at 80 columns mid-phrase:
    # "read delay p99 \n4.499 ms")
    worker = next(ln for ln in printed.splitlines() if ln.startswith("worker 0: 12 requests"))
    assert len(worker) > 80 and "read delay p99" in worker, printed
    assert worker.rstrip().endswith(" ms") and "timing error bound (p99)" in worker, printed


def test_piped_replay_progress_prints_plain_lines(monkeypatch):
    monkeypatch.setattr(progress, "PLAIN_EVERY_S", 0.05)
    piped = io.StringIO()
    with request_progress(Console(file=piped), "replay", 10) as update:
        update(3, 10)
        time.sleep(0.3)
    assert "replay: 3/10 requests" in piped.getvalue()
    piped = io.StringIO()
    with step_progress(Console(file=piped), "engines", 2, unit="engines") as update:
        update(1, description="engine static")
        time.sleep(0.3)
    assert "engine static: 1/2 engines" in piped.getvalue()
