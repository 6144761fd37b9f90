"""`cbbench diagnose` on a run whose server was killed mid-run says the server went away
(the errors rule), not also that it was under-used: low use while most requests failed is
no advice to offer more load (issue f1, item 2). A server that went away late, after a run
at low load, is still under-used while it answered, and the finding says so."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from cbbench.harness.diagnose import diagnose_run
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.run_folder import Run, load_run
from cbbench.harness.servers.launcher import kill_group, launch_reference_server
from diagnose_support import bench, hardware_file, sim_args, workload


def test_a_killed_server_is_not_diagnosed_as_under_used(tmp_path):
    hw = hardware_file(tmp_path)
    out = tmp_path / "killed"
    wl = workload("low", [(32, 32)] * 40)  # one in flight: under-used while it answers

    def kill_after_records(pgid: int) -> None:
        deadline = time.monotonic() + 60  # bounded: a loaded machine is slow to start
        path = out / "requests.jsonl"
        while time.monotonic() < deadline:
            if path.exists() and path.read_text().count("\n") >= 6:
                break
            time.sleep(0.02)
        kill_group(pgid)  # SIGKILL: connections refused from here on

    with launch_reference_server("tiny", "continuous", "cpu",
                                 sim_args(hw, "--max-num-seqs", "8")) as srv:  # fmt: skip
        killer = threading.Thread(target=kill_after_records, args=(srv.process.pid,))
        killer.start()
        bench(srv.base_url, wl, out, concurrency=1)
        killer.join(70)
    run = load_run(out)
    failed = [r for r in run.records if not r.ok]
    assert len(failed) > len(run.records) / 2  # the server went away early: most failed
    findings = {f.rule: f for f in diagnose_run(run).findings}
    assert "errors" in findings and "stopped answering" in findings["errors"].cause
    assert "low-concurrency" not in findings  # it fired: "raise --concurrency"


def _rec(i: int, ok: bool) -> RequestRecord:
    t = 0.5 * i
    if not ok:
        return RequestRecord(id=f"r{i}", index=i, prompt_len=32, output_len=32, sent_s=t,
                             end_s=t + 0.01, status="error", error_kind="connection",
                             error="cannot connect to 127.0.0.1:1: refused")  # fmt: skip
    return RequestRecord(
        id=f"r{i}", index=i, prompt_len=32, output_len=32, sent_s=t, first_token_s=t + 0.05,
        last_token_s=t + 0.4, end_s=t + 0.4, ttft_s=0.05, e2e_s=0.4, tpot_s=0.011,
        output_tokens_server=32, token_times_s=[t + 0.05 + 0.011 * k for k in range(32)],
        itl_s=[0.011] * 31,
    )  # fmt: skip


def _samples() -> list[dict]:
    return [
        {
            "t_s": 0.25 * i,
            "source": "server",
            "running": 1.0,
            "waiting": 0.0,
            "kv_usage": 0.04,
            "batch_occupancy": 0.12,
        }  # fmt: skip
        for i in range(32)
    ]


def test_a_server_gone_late_is_under_used_while_it_answered():
    meta = {"name": "synthetic", "load": {"concurrency": 1}}
    # 16 answered at low load, then the last 4 were refused: low use is still the finding
    recs = [_rec(i, ok=i < 16) for i in range(20)]
    run = Run(dir=Path("synthetic"), meta=meta, records=recs, timeseries=_samples())
    f = next(f for f in diagnose_run(run).findings if f.rule == "low-concurrency")
    assert "4 of 20 requests failed on connection errors from +8.0 s" in f.evidence[-1]
    assert "the use above covers the time the server answered" in f.evidence[-1]
    assert "it then went away" in f.cause
    # a healthy run at the same low load: the finding, without the qualification
    healthy = Run(dir=Path("synthetic"), meta=meta, records=[_rec(i, True) for i in range(20)],
                  timeseries=_samples())  # fmt: skip
    f = next(f for f in diagnose_run(healthy).findings if f.rule == "low-concurrency")
    assert "went away" not in f.cause and "connection" not in " ".join(f.evidence)
    # most refused: no under-use advice at all
    refused = Run(dir=Path("synthetic"), meta=meta, records=[_rec(i, i < 8) for i in range(20)],
                  timeseries=_samples())  # fmt: skip
    d = diagnose_run(refused)
    assert "low-concurrency" not in {f.rule for f in d.findings}
    # the header counts every measured request, and says how many failed
    from cbbench.harness.diagnose.render import text

    assert "(20 requests, 12 failed" in text([d]), text([d])


def test_a_503_shutting_down_is_the_server_going_away_not_shed_load():
    """A server stopped with SIGTERM answers 503 'server shutting down' to what it still
    receives: that is the server going away (errors rule: stopped answering; the run's
    verdict too), not a full queue shedding load; a plain 503 still is."""
    from cbbench.harness.diagnose.rules.errors import cause_of
    from cbbench.harness.results.outcome import server_gone, stopped_answering

    def failed(i: int, error: str) -> RequestRecord:
        return RequestRecord(id=f"f{i}", index=i, prompt_len=32, output_len=32, sent_s=i,
                             end_s=i + 0.01, status="error", error_kind="http",
                             error=error)  # fmt: skip

    down = failed(1, "HTTP 503: server shutting down")
    full = failed(2, "HTTP 503: queue full (max_waiting 64)")
    assert server_gone(down) and not server_gone(full)
    assert cause_of(down) == "connection" and cause_of(full) == "shed"
    recs = [_rec(0, True)] + [failed(i, "HTTP 503: server shutting down") for i in range(1, 6)]
    assert "the server stopped answering: 5 of 6" in (stopped_answering(recs) or "")
    assert stopped_answering([_rec(0, True)] + [failed(i, full.error) for i in range(1, 6)]) is None
