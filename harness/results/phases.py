"""Per-phase server times of a disaggregated server's requests (run.json's `phases`).

A P/D server splits a request's life into prefill queue, prefill, KV transfer, decode queue
and decode; the reference engine's decode worker reports them in its `cbbench` field
(`phases`, docs/disaggregation.md), which the client keeps in `RequestRecord.extra`. The
summary describes each phase over the successful requests that carry it, and the transfer's
bytes; nothing when no request carries phases (an aggregated server).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from cbbench.harness.results.records import RequestRecord
from cbbench.workloads.stats import describe_array

PHASES = ("prefill_queue_s", "prefill_s", "kv_transfer_s", "decode_queue_s", "decode_s")


def record_phases(r: RequestRecord) -> dict | None:
    phases = r.extra.get("phases")
    return phases if isinstance(phases, dict) else None


def phase_summary(ok: Sequence[RequestRecord]) -> dict | None:
    rows = [p for r in ok if (p := record_phases(r)) is not None]
    if not rows:
        return None

    def col(key: str) -> np.ndarray:
        vals = [p.get(key) for p in rows]
        return np.array([v if isinstance(v, (int, float)) else np.nan for v in vals], float)

    out: dict = {"requests": len(rows)}
    for key in PHASES:
        out[key] = describe_array(col(key))
    nbytes = col("kv_transfer_bytes")
    out["kv_transfer_bytes"] = describe_array(nbytes)
    out["kv_transfer_bytes_total"] = int(np.nansum(nbytes))
    return out
