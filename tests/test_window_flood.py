"""A short flood has no steady window: 200 requests sent over 2 s, served at ~13/s, so each
lives 1-15 s. In flight rises during every send; smoothing over the median E2E (~9 s) made
the ramp 0.0-1.8 s look level, and the summary led with it."""

from __future__ import annotations

from cbbench.harness.conclusions.window import add_window_summary, steady_window
from cbbench.harness.results.records import RequestRecord


def _flood(n: int = 200, send_span: float = 2.0, serve_rate: float = 13.0):
    out = []
    for i in range(n):
        sent = i * send_span / n
        end = max(sent + 0.5, (i + 1) / serve_rate)  # a queue served at serve_rate
        out.append(RequestRecord(
            id=str(i), index=i, prompt_len=1, output_len=10, sent_s=sent,
            first_token_s=end - 0.09, end_s=end, last_token_s=end, ttft_s=end - 0.09 - sent,
            e2e_s=end - sent, tpot_s=0.01, output_tokens_client=10,
        ))  # fmt: skip
    return out


def test_a_flood_shorter_than_its_requests_lives_has_no_window():
    recs = _flood()
    assert steady_window(recs) is None
    summary: dict = {}
    add_window_summary(summary, recs, "steady")
    assert summary["lead"] == "all" and summary["window_figures"] is None


def test_a_short_windows_warning_does_not_contradict_the_lead():
    """A window under a fifth of the run still leads (docs/rigor.md); its warning said "too
    little plateau to stand for the run" right under "(the summary leads with the window)"."""
    from test_rigor_window import synthetic

    recs = synthetic(span=20.0, ramp=0.0)
    late = [r for r in recs if r.sent_s < 4.0]  # then a long tail of slow drains
    for r in late[-5:]:
        r.end_s = r.last_token_s = r.sent_s + 200.0
        r.e2e_s = 200.0
    summary: dict = {}
    add_window_summary(summary, recs, "steady")
    w = summary["steady_window"]
    assert w is not None and w["warning"] and summary["lead"] == "steady"
    assert "stand for the run" not in w["warning"] and "leads with" in w["warning"]
