"""Per-worker timing in every run: loop lag, send lag, send window and a bound on each
worker's p99 timing error in run.json's summary, the printed lines and the report's flag;
a `--workers 2` run's merged summary is what `summarize` gives on the same records."""

import io

import numpy as np
import pytest
from cbbench.harness.load.runner import BenchConfig, run_bench, worker_timing_lines
from cbbench.harness.report import build_report
from cbbench.harness.results.client_timing import TIMING_BOUND_LIMIT_S, worker_timing
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.run_folder import load_run
from cbbench.harness.results.summary import summarize
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console
from servers.fake import Behavior, FakeServerConfig, threaded

# keys the runner adds after `summarize` (pool counters, worker outcomes), or derived from the
# workers' self-check samples that requests.jsonl does not hold
# keys the runner adds beside `summarize`'s (prefix_cache, agent: results/agent_summary.py)
RUNNER_KEYS = {  # the runner's own parts, beside summarize's (the window: bench's rule)
    "cancelled_in_flight", "connections", "timestamp_source", "client", "prefix_cache", "agent",
    "steady_window", "window_figures", "lead", "lead_note",
}
CLIENT_SAMPLE_KEYS = {"client_bound", "client_bound_reason"}


def _workload() -> Workload:
    """12 lone requests and 4 sessions of 3 turns, interleaved."""
    reqs, i = [], 0
    for k in range(12):
        reqs.append(RequestSpec(i, 8, 4 + k % 3))
        i += 1
        if k % 3 == 0:
            for turn in (1, 2, 3):
                reqs.append(RequestSpec(i, 6, 3, session_id=f"s{k}", turn=turn))
                i += 1
    return Workload("mix", 3, tuple(reqs))


def test_two_workers_merged_summary_is_summarize_of_the_records(tmp_path):
    wl = _workload()
    cfg = BenchConfig(
        base_url="",
        workload=wl,
        concurrency=4,
        workers=2,
        out_dir=tmp_path / "run",
        live=False,
        slo={"ttft": 0.5},
    )
    out = io.StringIO()
    with threaded(FakeServerConfig(Behavior(itl_s=0.01))) as srv:  # > 0.1 s: lag sampled
        cfg.base_url = srv.url
        res = run_bench(cfg, console=Console(file=out, width=200))
    run = load_run(res.run_dir)
    recs = run.records
    # every request sent once, none lost
    assert sorted(r.index for r in recs) == list(range(len(wl)))
    assert all(r.ok for r in recs) and {r.worker for r in recs} == {0, 1}
    # a session's turns stay on one worker, in order
    sessions: dict[str, list[RequestRecord]] = {}
    for r in recs:
        if r.session_id is not None:
            sessions.setdefault(r.session_id, []).append(r)
    assert len(sessions) == 4
    for turns in sessions.values():
        assert len({r.worker for r in turns}) == 1
        turns.sort(key=lambda r: r.turn)
        assert all(b.sent_s >= a.end_s for a, b in zip(turns, turns[1:], strict=False))
    # the merged summary (run.json) is what one process computes from the same records
    merged = run.meta["summary"]
    again = summarize(recs, None, cfg.slo)
    skip = RUNNER_KEYS | CLIENT_SAMPLE_KEYS
    assert {k: v for k, v in merged.items() if k not in skip} == {
        k: v for k, v in again.items() if k not in skip
    }
    # per worker: its own records, its send lag from them, a bound from its samples
    rows = merged["client"]["workers"]
    assert [x["worker"] for x in rows] == [0, 1]
    for x in rows:
        mine = [r for r in recs if r.worker == x["worker"]]
        assert x["requests"] == len(mine)
        assert x["send_lag_s"]["p99"] == pytest.approx(
            float(np.percentile([r.send_lag_s for r in mine], 99))
        )
        assert x["send_window_s"]["count"] == len(mine)  # one write per request
        assert x["timing_bound_s"] == pytest.approx(sum(x["timing_bound_terms_s"].values()))
        assert x["loop_lag_s"]["count"] >= 1
        if x["timestamp_source"] == "kernel":  # every kernel-stamped read's wait
            assert x["read_delay_s"]["count"] >= len(mine) and x["read_delay_s"]["p50"] >= 0
    assert merged["client"]["timing_bound_s"] == max(x["timing_bound_s"] for x in rows)
    printed = out.getvalue()
    assert "worker 0:" in printed and "worker 1:" in printed
    assert "timing error bound (p99)" in printed


def _rec(worker: int, index: int, itl: float) -> RequestRecord:
    t = [0.01 + k * itl for k in range(4)]
    return RequestRecord(
        id=f"r{index}",
        index=index,
        prompt_len=4,
        output_len=4,
        worker=worker,
        status="ok",
        sent_s=0.0,
        ready_s=0.0,
        send_lag_s=0.0001,
        first_token_s=t[0],
        last_token_s=t[-1],
        ttft_s=t[0],
        itl_s=[itl] * 3,
        token_times_s=t,
    )


def _samples(lag_s: float, stamps: str, window_s: float = 0.00002, delay_s=None) -> dict:
    return {
        "loop_lag_s": [lag_s] * 20,
        "cpu": [0.3],
        "timestamp_source": stamps,
        "send_window_s": {"p99": window_s, "count": 4},
        "read_delay_s": {"p99": delay_s, "count": 0 if delay_s is None else 50},
    }


@pytest.mark.parametrize(
    ("stamps", "lag_s", "delay_s", "itl_s", "receive_s", "merged"),
    [
        ("user", 0.004, None, 0.020, 0.004, False),  # a user stamp waits for the loop
        ("kernel", 0.004, 0.001, 0.020, 0.0, True),  # the kernel's time, no token came meanwhile
        ("kernel", 0.030, 0.001, 0.020, 0.030, True),  # a read late by more than a gap merges
        ("kernel", 0.004, 0.045, 0.020, 0.045, True),  # reads waited longer than the timer saw
        # late by more than a gap, but no two events shared a stamp: no read merged, no error
        # (a healthy tiny-model run warned at 3.1 ms of loop lag with 3 zero gaps in 31,081)
        ("kernel", 0.030, 0.001, 0.020, 0.0, False),
    ],
)
def test_bound_follows_from_the_stamp_source(stamps, lag_s, delay_s, itl_s, receive_s, merged):
    recs = [_rec(0, i, itl_s) for i in range(4)]
    if merged:  # one request's first two tokens came in one read: one stamp, a zero gap
        recs[0].itl_s = [0.0, itl_s, itl_s]
    out = worker_timing(recs, {0: _samples(lag_s, stamps, delay_s=delay_s)})
    (row,) = out["workers"]
    assert row["timing_bound_terms_s"] == pytest.approx({"send": 0.00002, "receive": receive_s})
    assert row["timing_bound_s"] == pytest.approx(0.00002 + receive_s)
    assert out["timing_bound_exceeded"] == (0.00002 + receive_s > TIMING_BOUND_LIMIT_S)


def test_report_flags_a_run_over_the_bound(tmp_path):
    """The worst worker sets the run's bound; summary lines, markdown, html and the CLI's
    warnings say so."""
    recs = [_rec(w, i, 0.02) for i in range(6) for w in (0, 1)]
    for i, r in enumerate(recs):
        r.index, r.id = i, f"r{i}"
    client = {
        "workers": {0: _samples(0.0005, "user"), 1: _samples(0.003, "user")},
        "timestamp_source": "user",
    }
    summary = summarize(recs, None, None, client)
    assert summary["client"]["timing_bound_exceeded"]
    assert summary["client"]["timing_bound_s"] == pytest.approx(0.003 + 0.00002)
    lines = worker_timing_lines(summary)
    assert len(lines) == 3 and lines[-1].startswith("TIMING BOUND MATERIAL")

    from cbbench.harness.results.run_folder import RunWriter

    def write(name: str, s: dict):
        w = RunWriter(tmp_path / name)
        w.write_run({"name": name, "status": "complete", "summary": s})
        for r in recs:
            w.add_record(r)
        w.close()
        return tmp_path / name

    ok = summarize(recs, None, None, {"workers": {0: _samples(0.0002, "user")}})
    assert not ok["client"]["timing_bound_exceeded"]
    report = build_report([write("late", summary), write("fine", ok)])
    md = report.markdown()
    flagged = [x for x in md.splitlines() if x.startswith("- **Timing:**")]
    assert len(flagged) == 1 and "late" in flagged[0] and "3.02 ms" in flagged[0]
    html = report.html()
    assert "Timing: " in html and "late 3.02 ms of TTFT p50" in html
    assert any("timing error bound" in w for w in report.trust_warnings())
