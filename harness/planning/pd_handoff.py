"""A disaggregated deployment's KV hand-off as its requests' phase stamps measured it, for
the P/D simulator's link (`router/pd_sim.py`, `execution/kv_link.py`: latency + bytes /
bandwidth, paid once per request between the prefill worker's first token and the decode
worker's arrival).

The decode workers' records carry `kv_transfer_s` (the pull: request to last byte) and its
bytes. A request's TTFT holds more between its prefill and its decode than the pull: the
prefill server's export of the blocks and its reply, the router's second hop, the decode
server's front end, the import into its pool. The hand-off is all of a request's TTFT its
stamps do not put in prefill queue, prefill or decode queue, less the request overhead the
simulation already pays before the prefill worker (`sim/request_overhead.py`: a from-run
fit's `c_req + c_req_load x in flight`; zero for a step-only calibration). Least squares of
it on the KV bytes gives the link's latency (the fixed part a request pays per hand-off)
and bandwidth. `pull_only` fits the pull's stamp alone (what the link was before, #56).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from cbbench.harness.errors import CbbenchError
from cbbench.reference_engine.sim.request_overhead import overhead_of
from cbbench.reference_engine.sim.run_fit_terms import in_flight, overheads

OTHER_PHASES = ("prefill_queue_s", "prefill_s", "decode_queue_s")


def handoff_samples(records: list[dict], over: dict[str, float] | None = None,
                    pull_only: bool = False) -> list[tuple[float, float]]:  # fmt: skip
    """(KV bytes, hand-off seconds) of each successful request with phase stamps."""
    rows = [r for r in records if r.get("ttft_s") is not None and r.get("e2e_s") is not None]
    load = in_flight([r["sent_s"] for r in rows], [r["e2e_s"] for r in rows])
    paid = overheads(over or {}, load)
    out = []
    for r, x in zip(rows, np.broadcast_to(paid, (len(rows),)), strict=True):
        ph = (r.get("extra") or {}).get("phases") or {}
        if ph.get("kv_transfer_s") is None or ph.get("kv_transfer_bytes") is None:
            continue
        y = ph["kv_transfer_s"] if pull_only else (
            r["ttft_s"] - float(x) - sum(ph.get(k) or 0.0 for k in OTHER_PHASES))  # fmt: skip
        out.append((float(ph["kv_transfer_bytes"]), float(y)))
    return out


def fit_handoff(samples: Iterable[tuple[float, float]]) -> str:
    """'bandwidth_gbps=B,latency_ms=L' (`--kv-link`) of (bytes, seconds) samples."""
    pairs = list(samples)
    if len(pairs) < 2 or len({b for b, _ in pairs}) < 2:
        raise CbbenchError(f"the KV hand-off fit needs requests of two KV sizes or more, got "
                           f"{len(pairs)} with phase stamps")  # fmt: skip
    x, y = np.array(pairs, float).T
    slope, intercept = np.polyfit(x, y, 1)
    return f"bandwidth_gbps={1 / max(slope, 1e-12) / 1e9:.4f},latency_ms={max(intercept, 0) * 1e3:.3f}"


def fit_handoff_runs(folders: Iterable[Path], over: dict[str, float] | None = None,
                     pull_only: bool = False) -> str:  # fmt: skip
    """The link of saved disaggregated runs (each folder's requests.jsonl), pooled."""
    samples, names = [], []
    for f in folders:
        path = Path(f) / "requests.jsonl"
        if not path.is_file():
            raise CbbenchError(f"{f}: no requests.jsonl (a `cbbench bench --out` run folder)")
        names.append(str(f))
        lines = path.read_text(encoding="utf-8").splitlines()
        try:
            recs = [json.loads(x) for x in lines if x.strip()]
        except json.JSONDecodeError as exc:
            raise CbbenchError(f"{path}: not JSON lines ({exc})") from None
        samples += handoff_samples(recs, over, pull_only)
    try:
        return fit_handoff(samples)
    except CbbenchError as exc:
        raise CbbenchError(f"{', '.join(names)}: {exc} (a disaggregated server's runs: its "
                           "records carry extra.phases)") from None


def add_handoff(spec, folders: list[str]) -> str:
    """`calibrate --from-run ... --kv-handoff RUN...`: the hand-off of those disaggregated
    runs, less `spec`'s request overhead, saved in its fit as `kv_link`; the line printed."""
    link = fit_handoff_runs([Path(f) for f in folders], overhead_of(spec))
    pull = fit_handoff_runs([Path(f) for f in folders], pull_only=True)
    spec.fit["kv_link"] = link
    return (f"KV hand-off from {len(folders)} disaggregated run(s)' phase stamps: {link} "
            f"(the pull's stamp alone: {pull}); saved as fit.kv_link: `cbbench sim "
            "--prefill-replicas` and `plan`'s P/D link unless another is given (the request "
            "overhead then paid once: the hand-off holds the decode server's)")
