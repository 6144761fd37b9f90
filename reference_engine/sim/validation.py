"""The simulator's held-out check: a workload never used for fitting (calibration.py), run
for real (CPU, in-process) and simulated on the fitted hardware, static and continuous;
throughput and p99 E2E side by side with their errors (targets: calibration.TARGETS)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.cost_model import CostModel, HardwareSpec, StepWork
from cbbench.reference_engine.sim.calibration import (
    DRIFT_WINDOW,
    HELD_OUT,
    TARGETS,
    VALIDATION,
    TracedClock,
    _cost_for,
    _cost_model_config,
    _traced,
    engine_config,
)
from cbbench.workloads.spec import RequestSpec


@dataclass
class ValidationRow:
    workload: str
    scheduler: str
    sim_throughput: float  # output tokens/s
    real_throughput: float
    sim_e2e_p99: float
    real_e2e_p99: float
    step_model_error: float  # fitted step times summed over the real run's own steps
    num_steps: int = 0  # the real run's engine steps
    num_preemptions: int = 0  # the real run's
    # the machine's speed over the real run's steps (fit's drift factors; > 1: slower)
    drift: float = 1.0

    @property
    def throughput_error(self) -> float:
        return self.sim_throughput / self.real_throughput - 1.0

    @property
    def e2e_p99_error(self) -> float:
        return self.sim_e2e_p99 / self.real_e2e_p99 - 1.0

    @property
    def drift_free_error(self) -> float:
        """Throughput error with the real run's time divided by the machine's drift."""
        return (1.0 + self.throughput_error) / self.drift - 1.0

    @property
    def ok(self) -> bool:
        return (
            abs(self.throughput_error) <= TARGETS["throughput"]
            and abs(self.e2e_p99_error) <= TARGETS["e2e_p99"]
        )

    def to_dict(self) -> dict:
        return {
            "workload": self.workload,
            "scheduler": self.scheduler,
            "sim_output_tok_s": self.sim_throughput,
            "real_output_tok_s": self.real_throughput,
            "throughput_error": self.throughput_error,
            "sim_e2e_p99_s": self.sim_e2e_p99,
            "real_e2e_p99_s": self.real_e2e_p99,
            "e2e_p99_error": self.e2e_p99_error,
            "step_model_error": self.step_model_error,
            "num_steps": self.num_steps,
            "num_preemptions": self.num_preemptions,
            "drift": self.drift,
            "within_targets": self.ok,
        }


def held_out(
    model: str,
    workloads: list[str],
    clock: str = "wall",
    dtype: str = "float32",
    num_requests: int | None = None,
    log: Callable[[str], None] = print,
) -> list[Validation]:
    """One Validation per held-out preset, each at its HELD_OUT size (requests, B);
    `num_requests` overrides the first one's request count (--validate-requests)."""
    out = []
    for i, name in enumerate(workloads):
        if name not in HELD_OUT:
            known = ", ".join(HELD_OUT)
            raise EngineError(f"held-out workload {name!r}: not one of {known}")
        n, b = HELD_OUT[name]
        if i == 0 and num_requests is not None:
            n = num_requests
        out.append(Validation(model, clock, dtype, name, n, b, log=log))
    return out


class Validation:
    """The held-out check: `workload` run for real (CPU, in-process, `clock`) and simulated
    on the fitted hardware, per scheduler. calibrate() steps the real runs in turn with its
    fit runs (`real_jobs`); `compare(spec)` runs any not yet run, simulates and returns the
    rows."""

    def __init__(
        self,
        model: str,
        clock: str = "wall",
        dtype: str = "float32",
        workload: str = VALIDATION["workload"],
        num_requests: int = VALIDATION["num_requests"],
        batch_size: int = VALIDATION["batch_size"],
        max_model_len: int = VALIDATION["max_model_len"],
        schedulers: tuple[str, ...] = ("static", "continuous"),
        log: Callable[[str], None] = print,
    ) -> None:
        from cbbench.workloads import load_workload

        self.model, self.clock, self.dtype, self.log = model, clock, dtype, log
        self.workload = workload
        self.batch_size, self.max_model_len = batch_size, max_model_len
        # one KV pool size for the real and the simulated runs: the same block ids, so the
        # simulator prices the same in-place / gathered layout the real backend meets
        self.num_kv_blocks = batch_size * -(-max_model_len // EngineConfig().block_size)
        wl = load_workload(workload, num_requests=num_requests)
        self.requests = [replace(r, arrival_s=None) for r in wl.requests]
        self.schedulers = schedulers
        self.real: dict[str, tuple[dict, list[tuple[StepWork, float]]]] = {}
        self.replay_kwargs: dict = {}  # e.g. prefix_block_size, for real and simulated runs
        self._warm = False

    def _config(self, scheduler: str, executor: str, hardware: str) -> EngineConfig:
        return engine_config(self.model, scheduler, self.batch_size, self.max_model_len,
                             executor, hardware, self.dtype, self.num_kv_blocks)  # fmt: skip

    def real_jobs(self) -> list[tuple[str, tuple[list[RequestSpec], EngineConfig, dict]]]:
        """(scheduler, (requests, real engine config, replay kwargs)) for run_interleaved."""
        return [
            (s, (self.requests, self._config(s, "real", "h100"), self.replay_kwargs))
            for s in self.schedulers
        ]

    def _run_real(self, scheduler: str) -> None:
        from cbbench.reference_engine.sim.simulate import replay

        if not self._warm:  # first run in this process: torch's one-time costs
            replay([RequestSpec(0, 16, 4), RequestSpec(1, 32, 4)],
                   engine_config(self.model, "continuous", 2, 64, "real", "h100", self.dtype))  # fmt: skip
            self._warm = True
        traces: list[TracedClock] = []
        t0 = time.perf_counter()
        res = replay(
            self.requests,
            self._config(scheduler, "real", "h100"),
            wrap_executor=_traced(_cost_for, self.clock, traces),
            **self.replay_kwargs,
        )
        self.real[scheduler] = (res.summary(), traces[-1].steps)
        self.log(
            f"  held-out run: {self.workload:<8} {scheduler:<10} {res.duration_s:7.2f} s "
            f"({self.clock} clock; "
            f"{time.perf_counter() - t0:.1f} s wall)"
        )

    def compare(self, spec: HardwareSpec, speed: list[float] | None = None,
                window: int = DRIFT_WINDOW) -> list[ValidationRow]:  # fmt: skip
        """Simulate on `spec` and compare with the real runs; `speed` (the fit's drift factor
        per `window` rounds) gives each row the machine's speed over its real run."""
        import json
        import tempfile
        from pathlib import Path

        from cbbench.reference_engine.sim.simulate import replay

        for s in self.schedulers:
            if s not in self.real:
                self._run_real(s)
        fitted = CostModel(_cost_model_config(self.model), spec, self.dtype)
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            hw = str(Path(tmp) / "hw.json")
            Path(hw).write_text(json.dumps(spec.to_dict()), encoding="utf-8")
            for s in self.schedulers:
                cfg = self._config(s, "sim", hw)
                sim = replay(self.requests, cfg, **self.replay_kwargs).summary()
                real, steps = self.real[s]
                measured = sum(d for _, d in steps)
                predicted = sum(fitted.time_of(w) for w, _ in steps)
                drift = 1.0
                if speed:
                    last = len(speed) - 1
                    free = sum(d / speed[min(i // window, last)] for i, (_, d) in enumerate(steps))
                    drift = measured / free
                rows.append(
                    ValidationRow(
                        self.workload,
                        s,
                        sim["output_throughput"],
                        real["output_throughput"],
                        sim["e2e_s"]["p99"],
                        real["e2e_s"]["p99"],
                        predicted / measured - 1.0,
                        len(steps),
                        real["num_preemptions"],
                        drift,
                    )
                )
        return rows
