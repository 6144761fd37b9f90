"""`cbbench selftest`: errors graded against the scripted server's own log (TTFT, ITL, chunk),
kernel and user stamps side by side, first requests included."""

import subprocess
import sys

import pytest
from cbbench.harness.cli.selftest import ServerProcess
from cbbench.harness.client.http1 import kernel_timestamps_supported
from cbbench.harness.servers.fake_server import Behavior, FakeServerConfig
from cbbench.harness.studies.selftest import measure

# serial (TTFT/ITL errors in ms against the scripted server's log): the README's command
# runs it after the parallel phase, alone
pytestmark = pytest.mark.serial


def test_measure_grades_ttft_and_itl_against_the_server_log():
    cfg = FakeServerConfig(Behavior(ttft_s=0.03, itl_s=0.01, queue_time_s=None))
    with ServerProcess(cfg) as srv:
        m = measure(srv.url, streams=4, workers=1, tokens=6, requests=12, seconds=5.0)
    assert m["failed"] == 0 and m["requests"] == 12  # no warmup: every request graded
    want = "kernel" if kernel_timestamps_supported() is None else "user"
    assert m["timestamp_source"] == want
    for key in ("ttft", "itl", "chunk"):
        p50, p99 = m[f"{key}_error_ms_p50"], m[f"{key}_error_ms_p99"]
        assert p50 is not None and p50 <= p99
    # the client cannot see a chunk before the server sent it, nor lose the server's 30 ms
    assert m["chunk_error_ms_p50"] >= 0
    assert -5 < m["ttft_error_ms_p50"] < 30 and -10 < m["itl_error_ms_p50"] < 10


def test_selftest_cli_prints_both_stamps():
    cmd = [sys.executable, "-m", "cbbench.harness.cli", "selftest", "--streams", "2"]
    cmd += ["--workers", "1", "--tokens", "4", "--requests", "6", "--seconds", "2"]
    cmd += ["--itl-ms", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("│")]
    stamps = {ln.split("│")[3].strip() for ln in rows}
    want = {"kernel", "user"} if kernel_timestamps_supported() is None else {"user"}
    assert stamps == want, proc.stdout
    assert "TTFT err" in proc.stdout and "ITL err" in proc.stdout
