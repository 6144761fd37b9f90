"""Whether a run can be trusted as a whole: finished, and with a server that kept answering.

- A run folder whose run.json still says `status: running` was killed (kill -9, OOM, a CI
  timeout) before it could write its end; `interrupted` means Ctrl-C. Both hold only the
  requests that finished: `cbbench report` flags them, `cbbench gate` refuses them unless
  `--allow-incomplete`.
- A run where most measured requests failed on connection errors (refused, reset, cut
  mid-stream) measured a dead server, not a slow one: `cbbench bench` says so and exits 1.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cbbench.harness.results.records import RequestRecord

# Error kinds that mean the server stopped answering (not a 4xx/5xx it chose to send).
CONNECTION_KINDS = ("connection", "stream")
COMPLETE = "complete"


def incomplete_reason(meta: dict[str, Any]) -> str | None:
    """Why a run did not finish, from its run.json; None if it did (or is too old to say)."""
    status = meta.get("status")
    if status in (None, COMPLETE):
        return None
    if status == "running":
        return (
            "did not finish (run.json still says status 'running': the process was killed "
            "before the end); it holds only the requests that finished"
        )
    if status == "interrupted":
        return "was interrupted (Ctrl-C); it holds only the requests that finished"
    if status == "stopped":
        return (
            "was stopped in Locust's web UI and Locust had not quit when run.json was last "
            "written; a restarted test may add requests"
        )
    return f"has status {status!r}, not {COMPLETE!r}"


def stopped_answering(records: Iterable[RequestRecord]) -> str | None:
    """A one-line verdict when most measured requests failed on connection errors."""
    measured = [r for r in records if not r.warmup]
    lost = [r for r in measured if r.status == "error" and r.error_kind in CONNECTION_KINDS]
    if not measured or 2 * len(lost) <= len(measured):
        return None
    first = first_failure(lost)
    at = failed_at(first)
    when = f" from +{at:.1f} s" if at is not None else ""
    return (
        f"the server stopped answering: {len(lost)} of {len(measured)} requests failed on "
        f"connection errors{when} ({first.error or first.error_kind})"
    )


def failed_at(r: RequestRecord) -> float | None:
    """When a request's failure was seen (its end; its send where it never ended): the one
    placement of a failure in time that `bench` and `diagnose` both print."""
    return r.end_s if r.end_s is not None else r.sent_s


def first_failure(failed: Iterable[RequestRecord]) -> RequestRecord:
    """The failed request whose failure was seen first (not the first one sent: a request
    in flight when the server died was sent long before it failed)."""
    return min(failed, key=lambda r: (failed_at(r) is None, failed_at(r) or 0.0))
