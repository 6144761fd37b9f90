"""Whether a Locust run kept its arrival schedule. Each user has one request in flight; when
every user is busy a due request waits (its `client_queue_s`), so an open-loop run with too few
users measures its own backlog, not the server at the asked rate (docs/benchmarking.md#locust-
web-ui-and-distributed-load). Said once at the end, with the cure."""

from __future__ import annotations

from collections.abc import Sequence

from cbbench.harness.results.records import RequestRecord

LATE_S = 0.1  # a request that waited longer than this for a free user was sent off schedule
MIN_LATE = 3  # and it is a finding once this many (and LATE_SHARE of the scheduled) were
LATE_SHARE = 0.05


def schedule_note(records: Sequence[RequestRecord], users: int | None) -> str | None:
    """One line when a material share of the scheduled requests waited for a free user."""
    scheduled = [r for r in records if not r.warmup and r.scheduled_s is not None]
    waits = sorted(r.client_queue_s for r in scheduled if (r.client_queue_s or 0.0) > LATE_S)
    if len(waits) < max(MIN_LATE, LATE_SHARE * len(scheduled)):
        return None
    who = f"all {users} users" if users else "every user"
    return (
        f"cbbench locust: {len(waits)} of {len(scheduled)} scheduled requests waited for a free "
        f"user (p50 {waits[len(waits) // 2]:.2f} s, max {waits[-1]:.2f} s): {who} were busy, "
        "so the run did not keep its arrival schedule; give it more users (-u)"
    )
