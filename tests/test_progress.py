"""Progress of the long in-process commands (issue 13): `sim --executor real`, `calibrate`
and `compare-engines` report finished requests / grid points / engines to a rich bar that is
shown on a terminal and writes nothing at all when the output is piped."""

from __future__ import annotations

import io

from cbbench.harness.console.progress import request_progress, step_progress
from cbbench.reference_engine.config.engine_config import DynamicConfig, EngineConfig, StaticConfig
from cbbench.reference_engine.sim.calibration import engine_config, run_interleaved
from cbbench.reference_engine.sim.calibration_grid import Grid, calibrate_grid
from cbbench.reference_engine.sim.simulate import replay_interleaved
from cbbench.workloads.spec import RequestSpec
from rich.console import Console


def _counts(calls: list[tuple[int, int]], total: int) -> None:
    assert calls, "no progress reported"
    done = [d for d, _ in calls]
    assert done == sorted(done), f"progress went backwards: {done}"
    assert calls[-1] == (total, total)
    assert all(n == total for _, n in calls)


def test_interleaved_replay_counts_requests_over_every_engine():
    reqs = [RequestSpec(i, 30 + i, 5 + i) for i in range(6)]
    cfgs = [
        EngineConfig(model="tiny", scheduler=s, executor="sim", hardware="h100",
                     static=StaticConfig(batch_size=2), dynamic=DynamicConfig(max_batch_size=2))
        for s in ("static", "dynamic", "continuous")
    ]  # fmt: skip
    calls: list[tuple[int, int]] = []
    replay_interleaved(reqs, cfgs, on_progress=lambda d, n: calls.append((d, n)))
    _counts(calls, 3 * len(reqs))


def test_calibration_runs_count_requests_over_every_job():
    reqs = [RequestSpec(i, 8 + 2 * i, 3 + i) for i in range(3)]
    jobs = [
        (reqs, engine_config("tiny", s, 2, 64, "real", "h100", "float32"))
        for s in ("static", "continuous")
    ]
    calls: list[tuple[int, int]] = []
    run_interleaved(jobs, "wall", on_progress=lambda d, n: calls.append((d, n)))
    _counts(calls, 2 * len(reqs))


def test_grid_calibration_counts_points():
    grid = Grid(batch_sizes=(1, 2), context_lens=(16,), prefill_lens=(16,), repeats=1,
                min_time_s=0.0)  # fmt: skip
    calls: list[tuple[int, int]] = []
    calibrate_grid("tiny", grid=grid, log=lambda s: None,
                   on_progress=lambda d, n: calls.append((d, n)))  # fmt: skip
    assert calls == [(1, 3), (2, 3), (3, 3)]


def test_bars_show_on_a_terminal_and_write_nothing_when_piped():
    bars = {
        "steps": lambda c: step_progress(c, "engines", 3, "engines"),
        "requests": lambda c: request_progress(c, "requests", 3),
    }
    for kind, bar in bars.items():
        piped = io.StringIO()
        with bar(Console(file=piped)) as update:
            update(1) if kind == "steps" else update(1, 3)
        assert piped.getvalue() == "", kind
        tty = io.StringIO()
        with bar(Console(file=tty, force_terminal=True, width=100)) as update:
            update(2) if kind == "steps" else update(2, 3)
        assert "2/3" in tty.getvalue(), kind


def test_step_progress_names_the_current_step():
    tty = io.StringIO()
    with step_progress(Console(file=tty, force_terminal=True, width=100), "engines", 2) as update:
        update(1, "hf-static: transformers")
    assert "hf-static: transformers" in tty.getvalue() and "1/2" in tty.getvalue()
