"""Warnings judged against the figures they affect (issue 42, finding 4): the timing bound is
shown as "± x ms" beside the latencies and warns only when it is a material share of them;
client-bound needs sustained lag, not one sample."""

from __future__ import annotations

import io

from cbbench.harness.console.live import summary_table
from cbbench.harness.console.outcome import worker_timing_lines
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.summary import summarize
from rich.console import Console


def _rec(i: int, ttft_s: float, send_lag_s: float = 0.0002) -> RequestRecord:
    t = [ttft_s + k * 0.005 for k in range(4)]
    return RequestRecord(
        id=f"r{i}", index=i, prompt_len=4, output_len=4, worker=0, status="ok",
        sent_s=0.05 * i, ready_s=0.05 * i, scheduled_s=0.05 * i, send_lag_s=send_lag_s,
        first_token_s=t[0], last_token_s=t[-1], ttft_s=t[0], e2e_s=t[-1], itl_s=[0.005] * 3,
        token_times_s=t,
    )  # fmt: skip


def _client(loop_lag_s: list[float]) -> dict:
    return {
        "loop_lag_s": loop_lag_s,
        "cpu": [0.2] * 10,
        "timestamp_source": "user",
        "workers": {
            0: {
                "loop_lag_s": loop_lag_s,
                "cpu": [0.2] * 10,
                "timestamp_source": "user",
                "send_window_s": {"p99": 0.0001, "count": 30},
                "read_delay_s": {"p99": None, "count": 0},
            }
        },
    }


def _render(summary: dict) -> str:
    buf = io.StringIO()
    Console(file=buf, width=100).print(summary_table(summary))
    return buf.getvalue()


def test_a_28ms_bound_on_tens_of_ms_ttft_is_shown_not_warned():
    # "TIMING BOUND EXCEEDED ... > 1.000 ms" fired at 2.8 ms where TTFT was tens of ms
    recs = [_rec(i, 0.040) for i in range(32)]
    s = summarize(recs, None, None, _client([0.0027] * 10))
    c = s["client"]
    assert 0.0027 < c["timing_bound_s"] < 0.0029
    assert not c["timing_bound_exceeded"] and c["timing_bound_judged_against"] == "TTFT p50"
    assert not any("TIMING BOUND" in x for x in worker_timing_lines(s))
    assert "(TTFT, ITL, E2E ± 2.80 ms: client timing error, p99)" in _render(s)


def test_a_bound_that_is_a_material_share_of_ttft_warns():
    recs = [_rec(i, 0.010) for i in range(32)]  # TTFT p50 10 ms: 2.8 ms is 28 % of it
    s = summarize(recs, None, None, _client([0.0027] * 10))
    assert s["client"]["timing_bound_exceeded"]
    assert worker_timing_lines(s)[-1].startswith("TIMING BOUND MATERIAL: a worker's bound 2.800")


def test_one_send_lag_outlier_is_not_client_bound():
    # CLIENT-BOUND fired on 30 requests from one 38 ms outlier
    recs = [_rec(i, 0.040) for i in range(30)]
    recs[7].send_lag_s = 0.038
    s = summarize(recs, None, None, _client([0.0002] * 10))
    assert not s["client_bound"], s["client_bound_reason"]
    assert "CLIENT-BOUND" not in _render(s)


def test_sustained_send_lag_is_client_bound():
    recs = [_rec(i, 0.040, send_lag_s=0.015 if i % 5 == 0 else 0.0002) for i in range(30)]
    s = summarize(recs, None, None, _client([0.0002] * 10))
    assert s["client_bound"] and "6 of 30 sends > 10 ms late" in s["client_bound_reason"]


def test_one_loop_lag_spike_is_not_client_bound_but_a_sustained_one_is():
    recs = [_rec(i, 0.040) for i in range(30)]
    spike = summarize(recs, None, None, _client([0.0002] * 9 + [0.030]))
    assert not spike["client_bound"]
    sustained = summarize(recs, None, None, _client([0.0002] * 6 + [0.030] * 4))
    assert sustained["client_bound"] and "event-loop lag" in sustained["client_bound_reason"]
