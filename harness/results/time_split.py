"""Where a request's time went, from the server's own per-request times
(client/server_timing.py, `extra["server_timing"]` of each record) and the client's E2E:
queue (arrival -> first scheduled), server prefill (scheduled -> first token), server decode
(first -> last token) and the remainder, E2E less those three: the client, the network and
the server's HTTP layer (with no queue time from the server, its queue is in the remainder).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from cbbench.harness.results.records import RequestRecord

PARTS = ("queue_s", "prefill_s", "decode_s")


def time_split(records: Sequence[RequestRecord]) -> dict | None:
    """Means over the successful records that carry server times (None: none do):
    {"count", "source", "e2e_s", "queue_s", "prefill_s", "decode_s", "remainder_s"}; a part
    the server never gave is None (and counted in the remainder)."""
    rows = [
        (r.e2e_s, r.extra["server_timing"])
        for r in records
        if r.ok and r.e2e_s is not None and type(r.extra.get("server_timing")) is dict
    ]
    if not rows:
        return None
    e2e = np.array([e for e, _ in rows], dtype=np.float64)
    out: dict = {"count": len(rows), "source": rows[0][1].get("source"), "e2e_s": float(e2e.mean())}
    rest = e2e.copy()
    for part in PARTS:
        vals = np.array([np.nan if t.get(part) is None else t[part] for _, t in rows])
        if np.isnan(vals).all():
            out[part] = None
            continue
        out[part] = float(np.nanmean(vals))
        rest -= np.nan_to_num(vals)
    out["remainder_s"] = float(rest.mean())
    return out


def time_split_line(split: dict | None) -> str | None:
    """One line for the summary: each part's mean and share of the mean E2E."""
    if not split or not split.get("e2e_s"):
        return None
    e2e = split["e2e_s"]
    names = {"queue_s": "queue", "prefill_s": "server prefill", "decode_s": "server decode",
             "remainder_s": "client + network"}  # fmt: skip
    parts = [
        f"{label} {split[k] * 1e3:.1f} ms ({split[k] / e2e:.0%})"
        for k, label in names.items()
        if split.get(k) is not None
    ]
    if split.get("queue_s") is None:
        parts[-1] += " (queue included: the server gave none)"
    return (
        f"where the time went (mean E2E {e2e * 1e3:.1f} ms, {split['count']} requests, "
        f"the {split['source']} server's own times): " + ", ".join(parts)
    )
