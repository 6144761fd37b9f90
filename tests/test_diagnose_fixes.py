"""Diagnose tells the fix that fits the run (issue 42, finding 7): the prefill-stall fix does
not ask to enable chunked prefill when it is already on (the default); after a killed server
the errors fix speaks of connection failures, not 429s; diagnose and bench place the failure
at the same time."""

from __future__ import annotations

import re
import threading
from pathlib import Path

from cbbench.harness.cli import main
from cbbench.harness.diagnose import diagnose_run
from cbbench.harness.results.run_folder import load_run
from cbbench.harness.servers.launcher import launch_reference_server
from servers.fake import Behavior, FakeServerConfig, process

from tests.diagnose_support import bench, hardware_file, sim_args, workload


def _stall_run(root: Path, *server: str) -> dict:
    """The prefill-stall scenario: 4 long streams, a 1,500-token prompt every 0.35 s."""
    lengths = [(16, 200)] * 4 + [(1500, 4)] * 6
    arrivals = [0.0] * 4 + [0.3 + 0.35 * k for k in range(6)]
    hw = hardware_file(root)
    with launch_reference_server("tiny", "continuous", "cpu", sim_args(hw, *server)) as srv:
        out = bench(srv.base_url, workload("stall", lengths, arrivals), root / "run", None)
    return {f.rule: f for f in diagnose_run(load_run(out)).findings}


def test_prefill_stall_fix_with_chunked_prefill_already_on(tmp_path: Path) -> None:
    # the default engine: chunked prefill on, a 2,048-token budget that holds each prompt
    stall = _stall_run(tmp_path)["prefill-stall"]
    for engine, fix in stall.fixes.items():
        assert not re.search(r"(?<!no-)enable-chunked-prefill with", fix), (engine, fix)
    assert "--enable-chunked-prefill" not in stall.fixes["cbbench"].replace("no-enable", "")
    assert "--max-num-batched-tokens 512" in stall.fixes["cbbench"]
    assert "2048-token step budget" in stall.fixes["cbbench"]


def test_prefill_stall_fix_with_chunked_prefill_turned_off(tmp_path: Path) -> None:
    stall = _stall_run(tmp_path, "--no-enable-chunked-prefill")["prefill-stall"]
    assert "without --no-enable-chunked-prefill" in stall.fixes["cbbench"]


def test_killed_server_errors_fix_and_failure_time_agree_with_bench(tmp_path: Path, capsys):
    out = tmp_path / "r"
    argv = ["bench", "--workload", "uniform", "--num-requests", "30", "--rate", "8", "--out",
            str(out), "--no-live", "--no-server-metrics", "--no-gpu-metrics"]  # fmt: skip
    with process(FakeServerConfig(Behavior(ttft_s=0.05, itl_s=0.02))) as srv:
        killer = threading.Timer(1.0, srv.kill)  # as a user's kill -9, mid-run
        killer.start()
        try:
            assert main([*argv, "--base-url", srv.url]) == 1
        finally:
            killer.cancel()
    err = capsys.readouterr().err
    bench_at = re.search(r"connection errors from \+(\d+\.\d) s", err)
    assert bench_at, err
    assert main(["diagnose", str(out)]) in (0, 1)
    text = capsys.readouterr().out
    diag_at = re.search(r"failures between (\d+\.\d) and", text)
    assert diag_at and diag_at.group(1) == bench_at.group(1), (err, text)
    errors = text[text.index("(errors)") :]
    assert "429" not in errors and "shed load" not in errors and "--max-waiting" not in errors
    assert "connections were refused or cut" in errors
    assert "fix (cbbench): connections refused or cut" in errors
    assert len(load_run(out).records) == 30
