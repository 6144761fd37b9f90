"""Errors are grouped by their text with request ids and numbers made alike (issue 51 #9): 35
identical 429s that differ only in their request id print as one group of 35, shown by one
real message; an HTTP status is kept apart (429 and 503 are two groups)."""

from __future__ import annotations

import uuid

from cbbench.harness.client.api import fail_record
from cbbench.harness.console.outcome import outcome_lines
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.summary import errors_by_reason, reason_key, summarize


def failed(i: int, msg: str) -> RequestRecord:
    r = RequestRecord(id=f"cbb-{i}", index=i, prompt_len=8, output_len=4)
    fail_record(r, "http_4xx", msg)
    return r


def test_35_rate_limits_with_their_ids_are_one_group() -> None:
    recs = [
        failed(
            i, f"HTTP 429: Rate limit reached for requests (request id req_{uuid.uuid4().hex[:20]})"
        )
        for i in range(35)
    ]
    recs += [
        failed(40 + i, f"HTTP 500: request {uuid.uuid4()} failed after {i} ms") for i in range(3)
    ]
    groups = errors_by_reason(recs)
    assert sorted(groups.values()) == [3, 35], groups
    summary = summarize(recs)
    lines = outcome_lines(summary)
    assert lines[0] == "failed 38 of 38; top reasons:"
    assert lines[1].startswith("  35 x HTTP 429: Rate limit reached") and "more" not in "".join(
        lines
    )


def test_statuses_and_different_texts_stay_apart() -> None:
    assert reason_key("HTTP 429: busy") != reason_key("HTTP 503: busy")
    assert reason_key("HTTP 400: prompt of 2100 tokens") == reason_key(
        "HTTP 400: prompt of 9 tokens"
    )
    assert reason_key("HTTP 400: bad model") != reason_key("HTTP 400: bad key")
