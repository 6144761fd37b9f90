"""Numbers in the report as people write them: a latency axis in ms says 15,000, not 1.5e+04;
a count (running peak) says 8, not 8.00."""

from __future__ import annotations

from cbbench.harness.report.svg import _tick_label, nice_ticks


def test_ticks_of_a_latency_axis_in_ms_have_no_exponent():
    labels = [_tick_label(t) for t in nice_ticks(0, 18_000)]
    assert labels == ["0", "5,000", "10,000", "15,000"]
    assert _tick_label(250_000) == "250,000" and _tick_label(0.25) == "0.25"
    assert _tick_label(2.5e9) == "2.5e+09" and _tick_label(1e-5) == "1e-05"


def test_a_column_of_whole_numbers_has_no_decimals():
    from cbbench.harness.report.table import fmt_column

    assert fmt_column([8.0, 8.0, 7.0]) == ["8", "8", "7"]  # running peak: a count
    assert fmt_column([8.0, 7.42]) == ["8.00", "7.42"]  # one format a column still
    assert fmt_column([1024.0, None])[0] == "1,024"


def test_a_fix_command_in_backticks_is_code_in_the_html_not_backticks():
    from cbbench.harness.diagnose.base import ENGINES, Finding
    from cbbench.harness.diagnose.render import _finding_html

    fix = "serve --prefill-replicas 1 (`cbbench plan --space 'mode=a<b'` sizes P:D)"
    f = Finding("pd-interference", "t", "c", ["e"], {e: fix for e in ENGINES})
    out = _finding_html(f, "cbbench")
    assert "`" not in out and "<code>cbbench plan --space &#x27;mode=a&lt;b&#x27;</code>" in out
