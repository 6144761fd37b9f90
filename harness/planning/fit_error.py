"""The error a calibrate --from-run fit was measured with: what `sim` and `plan` intervals use
(reference_engine/sim/intervals.py reads `fit.measured_error` and `fit.measured_on`)."""

from __future__ import annotations


def measured_error(errors: dict, checks: list[tuple[str, dict]],
                   runs: list[str]) -> tuple[dict, str]:  # fmt: skip
    """The error `sim` and `plan` intervals use, and where it was measured: per figure the
    largest of the held-back requests' and each --check-run's (a fit can match its own
    workload and miss another one's); the fit part's own (in-sample) only when neither exists."""
    measured = [e for e in (errors.get("held_back"),) if e] + [e for _, e in checks if e]
    where = ([f"the held-back requests of {', '.join(runs)}"] if errors.get("held_back") else [])
    where += [f"--check-run {p}" for p, e in checks if e]
    if not measured:
        return dict(errors.get("all") or {}), (
            f"the fitted requests of {', '.join(runs)} (in-sample: no held-back requests nor "
            "--check-run, so the error of a new workload is not measured)")
    worst: dict = {}
    for err in measured:
        for k, v in err.items():
            if v is not None and (worst.get(k) is None or abs(v) > abs(worst[k])):
                worst[k] = v
    return worst, " and ".join(where)
