"""Energy and cost of a run, from its summary (a pure function of the dict): what the runner
adds as `summary["efficiency"]` once the telemetry summaries are in.

Energy: the GPUs' (NVML power over the run, `telemetry.gpu.energy_j`), else the CPU
packages' (Linux powercap / RAPL, `telemetry.powercap.energy_j`), else absent with a note
that says why. `j_per_request` = joules / completed requests; `output_tokens_per_j` = output
tokens / joules. The samplers cover the whole run (warm-up requests included, where there
are any), the counts the measured requests.

Cost, from `--cost-per-hour` (`telemetry.price`, summed over replicas): the run costs
cost_per_hour x duration_s / 3600; `usd_per_1m_output_tokens` = that / output tokens x 1e6,
`usd_per_request` = that / completed requests.
"""

from __future__ import annotations

from typing import Any

from cbbench.harness.results.session_summary import add_server_hit_rate


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def energy_figures(summary: dict) -> dict:
    tel = summary.get("telemetry") or {}
    gpu, cpu = tel.get("gpu") or {}, tel.get("powercap") or {}
    completed = (summary.get("counts") or {}).get("completed") or 0
    tokens = summary.get("total_output_tokens") or 0
    for source, d in (("nvml", gpu), ("powercap", cpu)):
        joules = d.get("energy_j")
        if _num(joules) and joules > 0:
            return {
                "available": True,
                "source": source,
                "energy_j": float(joules),
                "j_per_request": joules / completed if completed else None,
                "output_tokens_per_j": tokens / joules,
            }
    why = []
    if not gpu:
        why.append("GPU sampling off")
    else:
        why.append(f"NVML: {gpu.get('reason') or 'no power reading'}")
    if cpu:
        why.append(f"powercap: {cpu.get('reason') or 'no energy reading'}")
    return {"available": False, "note": "no power reading (" + "; ".join(why) + ")"}


def cost_figures(summary: dict) -> dict | None:
    price = ((summary.get("telemetry") or {}).get("price") or {}).get("cost_per_hour")
    if not _num(price):
        return None
    duration = summary.get("duration_s") or 0.0
    completed = (summary.get("counts") or {}).get("completed") or 0
    tokens = summary.get("total_output_tokens") or 0
    run_usd = price * duration / 3600.0
    return {
        "cost_per_hour": float(price),
        "run_usd": run_usd,
        "usd_per_1m_output_tokens": run_usd / tokens * 1e6 if tokens else None,
        "usd_per_request": run_usd / completed if completed else None,
    }


def efficiency(summary: dict) -> dict:
    out: dict = {"energy": energy_figures(summary)}
    cost = cost_figures(summary)
    if cost is not None:
        out["cost"] = cost
    return out


def add_telemetry_figures(summary: dict) -> None:
    """What the runner derives once the telemetry summaries are in: the server's prefix-cache
    hit rate of a session run, and the efficiency figures."""
    add_server_hit_rate(summary)
    summary["efficiency"] = efficiency(summary)


def efficiency_line(summary: dict) -> str | None:
    """One console line: energy and cost figures, or why energy is absent."""
    eff = summary.get("efficiency")
    if not isinstance(eff, dict):
        return None
    parts = []
    e = eff.get("energy") or {}
    if e.get("available"):
        per = e["j_per_request"]
        parts.append(
            f"energy ({e['source']}) {e['energy_j']:,.1f} J: "
            + (f"{per:,.2f} J/request, " if per is not None else "")
            + f"{e['output_tokens_per_j']:,.3f} output tok/J"
        )
    # no reading (a CPU-only machine): said once, in run.json's efficiency.energy.note, not
    # on every run's terminal (a GPU that fails to answer is the sampler's own warning)
    c = eff.get("cost")
    if c and c.get("usd_per_1m_output_tokens") is not None:
        parts.append(
            f"cost at ${c['cost_per_hour']:g}/h: ${c['usd_per_1m_output_tokens']:,.4f} per 1M "
            f"output tokens, ${c['usd_per_request']:,.6f} per request"
        )
    return "; ".join(parts) or None
