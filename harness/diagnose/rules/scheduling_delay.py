"""Scheduling delay (the seeds' troubleshooting list): the device sits idle between steps
while the host schedules the next one and processes the last one's outputs, so every token of
every stream pays for host work. Read from the engine's step histograms (`step_gap`: executor
idle between two steps; `scheduler_time`: host time to build a step), which the reference
engine exports; silent for servers that export neither."""

from __future__ import annotations

from cbbench.harness.diagnose.base import Finding, Rule, RunView, ms, pct
from cbbench.harness.diagnose.fixes import fixes_for

SHARE = 0.2  # step gap p50 / token gap p50 at or above this: host work paces the tokens
MIN_GAP_S = 0.001  # a gap below this is noise whatever its share
MIN_STEPS = 20  # steps observed in the run's window


def _timing(v: RunView, field: str) -> dict:
    tele = ((v.meta.get("summary") or {}).get("telemetry") or {}).get("server") or {}
    est = tele.get(field)
    return est if isinstance(est, dict) else {}


def check(v: RunView) -> Finding | None:
    gap, sched = _timing(v, "step_gap"), _timing(v, "scheduler_time")
    g50, itl50 = gap.get("p50"), v.itl_p50
    if not isinstance(g50, (int, float)) or not itl50 or (gap.get("count") or 0) < MIN_STEPS:
        return None
    share = g50 / itl50
    if g50 < MIN_GAP_S or share < SHARE:
        return None
    evidence = [
        f"the executor sat idle {ms(g50)} between two steps (p50; p99 {ms(gap.get('p99'))}), "
        f"{pct(share)} of the gap between a stream's tokens (ITL p50 {ms(itl50)})",
    ]
    values = {"step_gap_p50_s": g50, "itl_p50_s": itl50, "gap_share": share}
    s50 = sched.get("p50")
    if isinstance(s50, (int, float)):
        evidence.append(
            f"building a step took {ms(s50)} of host time (p50; p99 {ms(sched.get('p99'))}); "
            f"the rest of the gap is applying the previous step's outputs and hand-offs"
        )
        values["scheduler_time_p50_s"] = s50
    return Finding(
        rule=RULE.id,
        title="the device idles between steps: host scheduling delay paces every token",
        cause="scheduling, input preparation and output processing run between steps instead "
        "of overlapping with the device's work; with many running sequences that host work "
        "grows and every stream's token gap with it",
        evidence=evidence,
        fixes=fixes_for("scheduling-delay"),
        values=values,
    )


RULE = Rule(
    "scheduling-delay",
    "the executor idles between steps (engine step-gap histogram) for a large share of ITL",
    check,
)
