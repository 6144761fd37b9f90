"""The per-replica figures of a run behind a router, as the summary holds them
(`telemetry.replicas`, harness/telemetry/replicas.py): one console line."""

from __future__ import annotations


def imbalance_line(summary: dict) -> str | None:
    rep = (summary.get("telemetry") or {}).get("replicas") or {}
    per = rep.get("per_replica") or {}
    if not rep.get("available") or not per:
        return None
    loads = ", ".join(
        f"{n} {(d.get('load') or {}).get('mean', 0.0):.2f}"
        + (f" ({int(d['routed'])} routed)" if d.get("routed") is not None else "")
        for n, d in sorted(per.items())
    )
    line = f"replicas: mean load {loads}"
    for what, x in (rep.get("imbalance") or {}).items():
        line += f"; {what} imbalance max/mean {x['max_over_mean']:.2f} (CV {x['cv']:.2f})"
    return line
