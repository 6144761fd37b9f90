"""`gate` between two `bench --repeats` folders asks the one comparability rule
(results/comparability.py) as it does for two runs: before, it judged repeats of another
workload and never said what to read with care (harness/gate/repeated.py)."""

from __future__ import annotations

import json
from pathlib import Path

from cbbench.harness.cli import main
from servers.fake import Behavior, FakeServerConfig, threaded


def _repeats(url: str, out: Path, workload: str, n: int) -> None:
    argv = ["bench", "--base-url", url, "--workload", workload, "--concurrency", "4",
            "--num-requests", str(n), "--repeats", "2", "--out", str(out),
            "--no-server-metrics", "--no-gpu-metrics", "--no-live"]  # fmt: skip
    assert main(argv) == 0


def test_gate_between_repeats_refuses_another_workload_and_says_what_differs(
    tmp_path: Path, capsys
) -> None:
    with threaded(FakeServerConfig(default=Behavior(ttft_s=0.01, itl_s=0.002))) as srv:
        _repeats(srv.url, tmp_path / "a", "prompt=16,output=4", 16)
        _repeats(srv.url, tmp_path / "b", "prompt=64,output=4", 16)
        _repeats(srv.url, tmp_path / "c", "prompt=16,output=4", 24)
    capsys.readouterr()
    gate = ["gate", "--baseline", str(tmp_path / "a")]
    assert main([*gate, "--candidate", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "not comparable: workload" in err and "--allow-incomparable" in err, err
    assert main([*gate, "--candidate", str(tmp_path / "b"), "--allow-incomparable"]) in (0, 1)
    assert "not comparable, judged anyway" in capsys.readouterr().err
    # the candidate's second repeat as a stalled client leaves it (bench's CLIENT-BOUND)
    second = tmp_path / "c" / json.loads((tmp_path / "c" / "repeats.json").read_text())["runs"][1]
    meta = json.loads((second / "run.json").read_text())
    meta["summary"].update(client_bound=True, client_bound_reason="send lag p99 40.0 ms")
    (second / "run.json").write_text(json.dumps(meta))
    assert main([*gate, "--candidate", str(tmp_path / "c")]) in (0, 1)
    out = capsys.readouterr().out
    assert "read with care: runs differ in requests: baseline 16, candidate 24" in out, out
    assert "Welch t-interval over run means" in out
    # repeat 1 may be flagged too on a busy host: then it is the one quoted
    line = next(x for x in out.splitlines() if x.startswith("read with care: the candidate: "))
    assert " of 2 repeats flagged; repeat " in line and "'s load generator may have made" in line
