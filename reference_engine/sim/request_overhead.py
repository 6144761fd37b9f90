"""A fitted server's time outside its engine steps (HTTP, tokenizing, the network, a front
end that slows with the load), as `calibrate --from-run` measured it: each request pays
`c_req + c_req_load x in_flight` (in_flight: the other requests in flight when it was sent)
before the engine sees it, and its TTFT and E2E count from its send.

`sim` and `plan` replay a workload with a fit's hardware JSON through here, the same way
`calibrate --check-run` predicts a run (run_fit.simulate_run): arrivals shifted by the
overhead, a first pass with its constant part giving the requests in flight, a second
using them; then each request's arrival is put back to its send time. A later turn of a
conversation (no arrival of its own: it follows its reply) is not shifted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
from cbbench.reference_engine.sim.run_fit_terms import in_flight, overheads
from cbbench.workloads.spec import RequestSpec


def overhead_of(hw) -> dict[str, float]:
    """A hardware spec's request overhead (zero unless it is a from-run fit's)."""
    fit = getattr(hw, "fit", None) or {}
    return {"c_req": float(fit.get("request_overhead_s") or 0.0),
            "c_req_load": float(fit.get("request_overhead_per_in_flight_s") or 0.0)}  # fmt: skip


def describe(over: dict[str, float]) -> str | None:
    """The one line `sim` and `plan` print (None: no overhead)."""
    if not any(over.values()):
        return None
    return (f"request overhead from the fit: {over['c_req'] * 1e3:.1f} ms + "
            f"{over['c_req_load'] * 1e3:.2f} ms x requests in flight at the send, added to "
            "every TTFT and E2E (as calibrate --check-run predicts)")  # fmt: skip


def with_overhead(requests: Sequence[RequestSpec], over: dict[str, float],
                  run: Callable[[list[RequestSpec]], object], replicas: int = 1):  # fmt: skip
    """`run(requests)` (a replay returning a result whose `.requests` carry `index` and
    `arrival_s`) with each request's overhead paid before it arrives (module doc). With
    `replicas`, each front end sees its share of the requests in flight."""
    reqs = list(requests)
    if not any(over.values()) or not reqs:
        return run(reqs)
    shift = [r.arrival_s is not None or r.session_id is None or (r.turn or 1) == 1 for r in reqs]
    sent = [r.arrival_s or 0.0 for r in reqs]
    load = np.zeros(len(reqs))
    res = None
    for _ in range(2 if over.get("c_req_load", 0.0) > 0 else 1):
        extra = overheads(over, load) * np.array(shift, dtype=float)
        moved = [replace(r, arrival_s=s + float(x)) if f else r
                 for r, s, x, f in zip(reqs, sent, extra, shift, strict=True)]  # fmt: skip
        res = run(moved)
        by_index = {q.index: q for q in res.requests}
        e2e = [((by_index[r.index].e2e_s or 0.0) if r.index in by_index else 0.0) + float(x)
               for r, x in zip(reqs, extra, strict=True)]  # fmt: skip
        load = in_flight(sent, e2e) / max(replicas, 1)
    pos = {r.index: float(x) for r, x in zip(reqs, extra, strict=True)}
    for q in res.requests:
        q.arrival_s -= pos.get(q.index, 0.0)
    return res
