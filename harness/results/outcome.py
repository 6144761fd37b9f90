"""Whether a run can be trusted as a whole: finished, and with a server that kept answering.

- A run folder whose run.json still says `status: running` was killed (kill -9, OOM, a CI
  timeout) before it could write its end; `interrupted` means Ctrl-C. Both hold only the
  requests that finished: `cbbench report` flags them, `cbbench gate` refuses them unless
  `--allow-incomplete`.
- A run where most measured requests failed on connection errors (refused, reset, cut
  mid-stream) measured a dead server, not a slow one: `cbbench bench` says so and exits 1.
- A run whose first requests all fail with the same client error (HTTP 4xx: a wrong model
  name, a bad key, a refused parameter) would fail every request the same way: it stops
  early (`FirstFailures`) and prints the server's own message.

`exit_code` is what `cbbench bench` returns (docs/benchmarking.md "Exit codes").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.summary import RunSummary, reason_key

EXIT_OK = 0  # every measured request completed
EXIT_FAILED = 1  # none completed, stopped early on a client error, or the server went away
EXIT_BAD_INPUT = 2  # a flag, workload or server address the run could not start with
EXIT_SOME_FAILED = 3  # the run finished; some requests failed (their reasons are printed)
EXIT_SATURATED = 4  # stopped over-saturated (--on-saturation stop); finished requests kept
EXIT_INTERRUPTED = 130  # Ctrl-C; the requests that finished are kept
EARLY_STOP_AFTER = 5  # this many first answers, all the same client error: stop
CLIENT_ERROR_KINDS = ("http_4xx",)

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
    if status == "over-saturated":
        return (
            "was stopped over-saturated (its queue grew without bound); it holds only the "
            "requests that finished before the stop"
        )
    if status == "stopped-early":
        why = (meta.get("summary") or {}).get("stopped_by_watch")
        return "was stopped early" + (f" ({why})" if why else "") + (
            "; it holds only the requests that finished"
        )
    if status == "failed":
        why = meta.get("error")
        return "failed before it finished" + (f" ({why})" if why else "")
    if status == "empty":
        return "holds no measured request (nothing was sent or finished)"
    if status == "stopped":
        return (
            "was stopped in Locust's web UI and Locust had not quit when run.json was last "
            "written; a restarted test may add requests"
        )
    return f"has status {status!r}, not {COMPLETE!r}"


SHUTTING_DOWN = ("shutting down", "shut down")  # a 503 from a server on its way out


def server_gone(r: RequestRecord) -> bool:
    """A failure that says the server went away: a connection refused or cut, or an HTTP 503
    whose message says it is shutting down (not a full queue)."""
    if r.error_kind in CONNECTION_KINDS:
        return True
    err = (r.error or "").lower()
    return err.startswith("http 503") and any(s in err for s in SHUTTING_DOWN)


def _gone_kinds(lost: list[RequestRecord]) -> str:
    conn = sum(r.error_kind in CONNECTION_KINDS for r in lost)
    if conn == len(lost):
        return "connection errors"
    return "HTTP 503 'shutting down'" if not conn else "connection errors or 503 'shutting down'"


def stopped_answering(records: Iterable[RequestRecord]) -> str | None:
    """A one-line verdict when most measured requests failed because the server went away
    (connection errors, or 503 'shutting down')."""
    measured = [r for r in records if not r.warmup]
    lost = [r for r in measured if r.status == "error" and server_gone(r)]
    if not measured or 2 * len(lost) <= len(measured):
        return None
    first = first_failure(lost)
    at = failed_at(first)
    when = f" from +{at:.1f} s" if at is not None else ""
    return (
        f"the server stopped answering: {len(lost)} of {len(measured)} requests failed on "
        f"{_gone_kinds(lost)}{when} ({first.error or first.error_kind})"
    )


class FirstFailures:
    """Watches the first EARLY_STOP_AFTER finished requests (warmup included); `add` returns
    a one-line reason to stop when every one of them failed with the same client error.
    Whether the run then *stopped early* is `held_back`'s to say: when every request had
    already been sent, nothing was held back and the run simply finished with failures."""

    def __init__(self, total: int) -> None:
        self.needed = min(EARLY_STOP_AFTER, total)
        self.seen: list[RequestRecord] = []
        self.verdict: str | None = None

    def add(self, rec: RequestRecord) -> str | None:
        if self.verdict is not None or len(self.seen) >= self.needed:
            return None
        self.seen.append(rec)
        if len(self.seen) < self.needed or self.needed < 2:
            return None
        keys = {reason_key(r.error) for r in self.seen if r.error_kind in CLIENT_ERROR_KINDS}
        if all(r.status != "ok" for r in self.seen) and len(keys) == 1 and all(
            r.error_kind in CLIENT_ERROR_KINDS for r in self.seen
        ):
            self.verdict = (
                f"stopped early: the first {len(self.seen)} requests all failed with the same "
                f"client error, so every request would: {self.seen[0].error}"
            )
        return self.verdict

    def held_back(self, never_sent: int, cancelled: int) -> str | None:
        """The "stopped early" line when the stop held requests back (never sent, or
        cancelled in flight); None when it did not (then the failures speak for themselves)."""
        if self.verdict is None or never_sent + cancelled <= 0:
            return None
        held = [f"{never_sent} never sent"] if never_sent > 0 else []
        held += [f"{cancelled} cancelled in flight"] if cancelled > 0 else []
        return self.verdict.replace("stopped early:", f"stopped early ({', '.join(held)}):", 1)


def exit_code(summary: RunSummary, interrupted: bool, failure: str | None) -> int:
    """What a finished `bench` run exits with (see the EXIT_* constants)."""
    if interrupted:
        return EXIT_INTERRUPTED
    if (summary.get("over_saturated") or {}).get("stopped"):
        return EXIT_SATURATED
    counts = summary.get("counts") or {}
    if failure or (counts.get("total") and not counts.get("completed")):
        return EXIT_FAILED
    return EXIT_SOME_FAILED if counts.get("failed") else EXIT_OK


def all_failed(summary: RunSummary) -> str | None:
    """A one-line verdict when no measured request completed, with the top reason."""
    counts = summary.get("counts") or {}
    if not counts.get("total") or counts.get("completed"):
        return None
    reasons = summary.get("errors_by_reason") or {}
    top = next(iter(reasons), None)
    why = f": {top}" if top else ""
    if top and "context" in top.lower():  # ours, vLLM's "maximum context length", others'
        why += (
            " (the workload's prompts outgrow the model's context: a workload of shorter "
            "prompts, e.g. docs/specs/agent-small.toml for agents, or a longer-context model)"
        )
    return f"all {counts['total']} requests failed{why}"


def failed_at(r: RequestRecord) -> float | None:
    """When a request's failure was seen (its end; its send where it never ended): the one
    placement of a failure in time that `bench` and `diagnose` both print."""
    return r.end_s if r.end_s is not None else r.sent_s


def first_failure(failed: Iterable[RequestRecord]) -> RequestRecord:
    """The failed request whose failure was seen first (not the first one sent: a request
    in flight when the server died was sent long before it failed)."""
    return min(failed, key=lambda r: (failed_at(r) is None, failed_at(r) or 0.0))
