"""`bench --duration` when the request count ends the run first: said, not left to the reader
(harness/conclusions/run_summary.py). A real `bench` against the reference engine on loopback."""

from __future__ import annotations

import json

from cbbench.harness.cli import main
from cbbench.reference_engine.config.engine_config import EngineConfig

from tests.server_support import serve


def test_a_run_that_ran_out_of_requests_before_its_duration_says_so(tmp_path, capsys) -> None:
    """`cbbench serve --model tiny`, `bench --rate 40 --duration 12s`: it stopped at the
    preset's 200 requests after 4.6 s and printed 'duration 4.62 s' only."""
    with serve(EngineConfig(model="tiny", max_model_len=128)) as (url, _):
        common = ["bench", "--base-url", url, "--workload", "prompt=16,output=4", "--no-live",
                  "--no-gpu-metrics"]  # fmt: skip
        argv = [*common, "--rate", "40", "--duration", "10s", "--num-requests", "20"]
        assert main([*argv, "--out", str(tmp_path / "short")]) == 0
        out = capsys.readouterr().out
        # closed loop, far more requests than 1 s holds: the duration ended it
        argv = [*common, "--concurrency", "2", "--duration", "1s", "--num-requests", "5000"]
        assert main([*argv, "--out", str(tmp_path / "timed")]) == 0
        timed = capsys.readouterr().out
    note = json.loads((tmp_path / "short" / "run.json").read_text())["summary"]
    note = note["duration_not_reached"]
    assert note["duration_s"] == 10 and note["requests"] == 20 and note["last_send_s"] < 9
    assert "ended before --duration 10 s: all 20 requests were sent by " in out
    assert "raise it to run for the duration" in note["line"]
    assert "ended before --duration" not in timed
    summary = json.loads((tmp_path / "timed" / "run.json").read_text())["summary"]
    assert "duration_not_reached" not in summary
