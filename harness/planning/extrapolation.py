"""Which of a plan's configurations step beyond what the hardware fit measured.

A step-time fit (`cbbench calibrate`: engine steps, a grid, or a run's replay) records the
largest step and batch it saw (`fit.measured_steps`, reference_engine/sim/step_range.py). A
configuration whose token budget (`max_num_batched_tokens`, continuous batching) or
`max_num_seqs` is above them lets the simulator make steps the fit never measured: its step
times there are the linear model extrapolated. `cbbench plan` keeps such points and marks
them (on screen, plan.json's `extrapolated`, plan.html), saying by how far (value / largest
measured). A hardware that records no range (a preset, an older fit) marks nothing and says
so once."""

from __future__ import annotations

from typing import Any


def measured_steps(fit: dict | None) -> dict | None:
    """The fit's measured range, or None where it records none."""
    steps = (fit or {}).get("measured_steps")
    if not isinstance(steps, dict) or not steps.get("max_tokens") or not steps.get("max_seqs"):
        return None
    return steps


def outside(config: dict[str, Any], fit: dict | None) -> dict[str, dict[str, float]]:
    """setting -> {"value", "measured_max", "times"} for each setting above the measured
    range ({} inside it, or where the fit records no range)."""
    steps = measured_steps(fit)
    if steps is None:
        return {}
    limits = [("max_num_seqs", steps["max_seqs"])]
    if config.get("scheduler", "continuous") == "continuous":
        limits.append(("max_num_batched_tokens", steps["max_tokens"]))
    out = {}
    for key, measured in limits:
        value = config.get(key)
        if isinstance(value, (int, float)) and value > measured:
            out[key] = {"value": value, "measured_max": measured,
                        "times": round(value / measured, 2)}  # fmt: skip
    return out


def describe(extrapolated: dict[str, dict[str, float]]) -> str:
    """'max_num_batched_tokens 8192 is 5.8x the largest step measured (1408 tokens)'."""
    units = {"max_num_batched_tokens": "tokens", "max_num_seqs": "sequences"}
    what = {"max_num_batched_tokens": "step", "max_num_seqs": "batch"}
    return "; ".join(
        f"{k} {v['value']:g} is {v['times']:g}x the largest {what.get(k, k)} the fit measured "
        f"({v['measured_max']:g} {units.get(k, '')})".rstrip()
        for k, v in extrapolated.items()
    )


def of_engine(cfg, fit: dict | None) -> dict[str, dict[str, float]]:
    """`outside` for an EngineConfig (`cbbench sim`): its batch slots (max_num_seqs, a static
    or dynamic batch size) and, continuous, its token budget."""
    config = {"scheduler": cfg.scheduler, "max_num_seqs": cfg.max_batch_slots}
    return outside({**config, **cfg.step_budget()}, fit)


def line(name: str, extrapolated: dict[str, dict[str, float]]) -> str:
    """The EXTRAPOLATED line `plan` prints for its choice, for one of `sim`'s engines."""
    return (f"EXTRAPOLATED: {name}: {describe(extrapolated)}: its step times there are the "
            "fit's model beyond what it measured; calibrate with larger steps, or keep the "
            "settings within the measured range")  # fmt: skip


def no_range_line(hw) -> str | None:
    """Said once where a fitted hardware records no measured range (a preset or an older fit)."""
    if hw.linear is None or measured_steps(hw.fit) is not None:
        return None
    return (f"hardware {hw.name}: its fit records no measured step range (a preset or an "
            "older calibration): whether a budget extrapolates it is unknown")
