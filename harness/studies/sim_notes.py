"""`cbbench sim`'s lines under each engine: its prediction interval, and whether its settings
step beyond what the hardware fit measured (harness/planning/extrapolation.py, as `plan`)."""

from __future__ import annotations

from cbbench.harness.planning import extrapolation
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.sim.simulate import SimResult
from rich.console import Console


def print_interval(console: Console, name: str, hw, res: SimResult) -> None:
    """This run's interval (reference_engine/sim/intervals.py): a calibrated fit's from its
    residuals, else from the error the hardware was measured with; or "error unknown"."""
    from cbbench.reference_engine.sim.intervals import error_of, interval_for

    iv = interval_for(hw.fit, len(res.steps)) if hw.linear is not None else None
    s = res.summary()
    if hw.steps or not s["output_throughput"]:
        return
    words = f"{iv.level:.0%} prediction interval from the fit's residuals" if iv else ""
    if iv is None:
        iv, kind, words = error_of(hw)
        if kind == "unknown":
            return console.print(f"  {name}: {words}", highlight=False, soft_wrap=True)
    lo, hi = iv.throughput(s["output_throughput"])
    p_lo, p_hi = iv.latency(s["e2e_s"]["p99"])
    console.print(f"  {name}: {words}: {lo:.1f}-{hi:.1f} output tok/s, p99 E2E "
                  f"{p_lo:.2f}-{p_hi:.2f} s", highlight=False, soft_wrap=True)  # fmt: skip


def print_extrapolation(console: Console, name: str, cfg: EngineConfig, hw) -> dict:
    """The EXTRAPOLATED line for an engine beyond the fit's measured steps; what is beyond."""
    ext = extrapolation.of_engine(cfg, hw.fit)
    if ext:
        console.print(extrapolation.line(name, ext), highlight=False, markup=False)
    return ext


def print_no_range(console: Console, hw) -> None:
    if note := extrapolation.no_range_line(hw):
        console.print(note, highlight=False, soft_wrap=True)
