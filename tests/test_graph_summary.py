"""The `graph` summary's session figures on hand-made records: the critical path (the call
that ended last, back through the predecessor that ended last) splits the makespan into time on
the server and waiting; a failed call fails its session; a session the run cut short (no
call failed) is counted apart and left out of session_success."""

from __future__ import annotations

import pytest
from cbbench.harness.results.graph_summary import graph_summary, session_figures
from cbbench.harness.results.records import RequestRecord


def _call(sid, index, after, ready, sent, end, calls, ok=True, depth=0):
    r = RequestRecord(id=f"cbb-{index}", index=index, prompt_len=10, output_len=5)
    r.session_id, r.ready_s, r.sent_s, r.end_s = sid, ready, sent, end
    r.first_token_s, r.ttft_s = sent + 0.1, 0.1
    if not ok:
        r.status, r.error = "error", "HTTP 500"
    r.extra["graph"] = {"after": after, "depth": depth, "calls": calls, "wait_s": 0.0}
    return r


def _fan() -> list[RequestRecord]:  # orchestrator -> A, B -> reducer
    return [
        _call("s1", 0, [], 0.0, 0.0, 1.0, 4),
        _call("s1", 1, [0], 1.5, 1.5, 3.0, 4, depth=1),  # A: the slow branch
        _call("s1", 2, [0], 1.5, 2.0, 2.5, 4, depth=1),  # B: waited 0.5 s for a slot
        _call("s1", 3, [1, 2], 3.2, 3.3, 4.0, 4, depth=2),
    ]


def test_critical_path_splits_the_makespan():
    f = session_figures(_fan())
    assert f["success"] and f["fan_out_width"] == 2 and f["critical_path_calls"] == 3
    assert f["makespan_s"] == pytest.approx(4.0)
    assert f["critical_path_server_s"] == pytest.approx(0.7 + 1.5 + 1.0)  # reducer, A, orch
    assert f["critical_path_wait_s"] == pytest.approx(0.8)


def test_failed_and_cut_sessions():
    failed = [
        _call("s2", 10, [], 0.0, 0.0, 1.0, 2),
        _call("s2", 11, [10], 1.0, 1.0, 2.0, 2, ok=False),
    ]
    cut = [_call("s3", 20, [], 0.0, 0.0, 1.0, 3), _call("s3", 21, [20], 1.0, 1.0, 2.0, 3, depth=1)]
    g = graph_summary([*_fan(), *failed, *cut])
    assert g["sessions"] == 3 and g["sessions_succeeded"] == 1 and g["sessions_cut"] == 1
    assert g["session_success"] == pytest.approx(0.5)  # 1 of the 2 that ended
    assert g["makespan_s"]["count"] == 1 and g["calls"] == 8 and g["calls_answered"] == 7
    assert (
        set(g["by_step"]) == {"1", "2", "3"} and g["by_step"]["2"]["count"] == 3
    )  # A, B, s3's second (ok only)
    assert g["fan_out_width"]["max"] == 2
