"""`cbbench locust` says when an open-loop run did not keep its schedule: with `--rate 8
-u 8 --processes 2` on the mixed workload, 30 of 40 requests waited up to 6.9 s for a free
user and the run reported 3.6 req/s without a word (Locust's table does not show it)."""

from __future__ import annotations

from cbbench.harness.locust.schedule_note import schedule_note
from cbbench.harness.results.records import RequestRecord


def _rec(i: int, wait: float | None, scheduled: float | None = 0.0) -> RequestRecord:
    r = RequestRecord(str(i), i, 10, 5, sent_s=1.0, end_s=2.0)
    r.scheduled_s, r.client_queue_s = scheduled, wait
    return r


def test_requests_waiting_for_a_user_are_said_once():
    recs = [_rec(i, 0.5 + i) for i in range(30)] + [_rec(30 + i, None) for i in range(10)]
    note = schedule_note(recs, 8)
    assert note is not None
    assert "30 of 40 scheduled requests waited" in note and "max 29.50 s" in note
    assert "all 8 users were busy" in note and "more users (-u)" in note


def test_a_kept_schedule_or_a_closed_loop_says_nothing():
    assert schedule_note([_rec(i, 0.002) for i in range(40)], 8) is None  # microseconds late
    assert schedule_note([_rec(i, 1.0) for i in range(2)], 8) is None  # two are no finding
    assert schedule_note([_rec(i, None, None) for i in range(40)], 8) is None  # closed loop
