"""Grid calibration: time single model-runner steps over a grid of shapes and fit the step-time
model to them (the method `cbbench calibrate` used before the engine-trace fit of
calibration.py).

Each grid point is one step run repeatedly on the ModelRunner (not the engine loop): decode
batches x context lengths, and single prefills. It is quicker than the trace fit, works on
any device the runner supports (`--device cuda`), and is what `cbbench calibrate
--batch-sizes/--context-lens/--prefill-lens/--repeats/--min-time/--device` selects.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from cbbench.reference_engine.core.block_manager import BlockManager
from cbbench.reference_engine.core.executor import ScheduledChunk
from cbbench.reference_engine.core.outputs import RequestMetrics
from cbbench.reference_engine.core.sequence import Sequence
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.cost_model import (
    STEP_TERMS,
    CostModel,
    HardwareSpec,
    fit_linear,
)
from cbbench.reference_engine.model.config import resolve_model_config
from cbbench.reference_engine.sampling_params import SamplingParams
from cbbench.reference_engine.sim.calibration import Calibration, measured_spec
from cbbench.reference_engine.sim.step_range import step_range

BLOCK_SIZE = 16
MAX_RUNS = 30  # per grid point, however short --min-time makes a step


@dataclass(frozen=True)
class Grid:
    """The grid of shapes and how long each is timed (the old calibrate defaults)."""

    batch_sizes: tuple[int, ...] = (1, 4, 16)
    context_lens: tuple[int, ...] = (32, 256, 1024)
    prefill_lens: tuple[int, ...] = (32, 128, 512)
    repeats: int = 3  # at least this many timed runs per point
    min_time_s: float = 0.3  # keep repeating a point up to this long (MAX_RUNS at most)

    def __post_init__(self) -> None:
        for name in ("batch_sizes", "context_lens", "prefill_lens"):
            vals = getattr(self, name)
            if not vals or min(vals) < 1:
                raise EngineError(f"--{name.replace('_', '-')}: expected positive integers")
        if self.repeats < 1:
            raise EngineError(f"--repeats must be >= 1, got {self.repeats}")
        if self.min_time_s < 0:
            raise EngineError(f"--min-time must be >= 0, got {self.min_time_s}")

    def points(self) -> list[tuple[str, int, int]]:
        pts = [("decode", b, c) for b in self.batch_sizes for c in self.context_lens]
        return pts + [("prefill", 1, n) for n in self.prefill_lens]


def parse_ints(text: str, flag: str, zero: bool = False) -> tuple[int, ...]:
    """'1,4,16' -> (1, 4, 16) (`zero`: 0 allowed); a clear error naming the flag otherwise."""
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise EngineError(f"{flag}: expected a comma list of integers, got {text!r}") from None
    if not vals or min(vals) < (0 if zero else 1):
        kind = "non-negative" if zero else "positive"
        raise EngineError(f"{flag}: expected {kind} integers, got {text!r}")
    return vals


def _chunks(bm: BlockManager, batch: int, context: int, decode: bool) -> list[ScheduledChunk]:
    """`batch` sequences of `context` tokens: decode = the last token to compute (the rest
    counts as cached), prefill = all of them."""
    chunks = []
    for i in range(batch):
        ids = [1 + (i + j) % 97 for j in range(context)]
        seq = Sequence(f"c{i}", ids, SamplingParams(max_tokens=1, temperature=0.0),
                       RequestMetrics(0.0))  # fmt: skip
        if not bm.allocate_slots(seq, context):
            raise EngineError(f"calibration grid point {batch}x{context} does not fit the KV cache")
        if decode:
            seq.num_computed_tokens = context - 1
        chunks.append(ScheduledChunk(seq, context - seq.num_computed_tokens))
    return chunks


def _time_point(runner, bm: BlockManager, kind: str, batch: int, context: int, grid: Grid):
    chunks = _chunks(bm, batch, context, decode=kind == "decode")
    runner.execute(chunks)  # warm-up
    times: list[float] = []
    start = time.perf_counter()
    # the minimum of several runs is the estimate least disturbed by other processes
    while len(times) < grid.repeats or (
        time.perf_counter() - start < grid.min_time_s and len(times) < MAX_RUNS
    ):
        t0 = time.perf_counter()
        runner.execute(chunks)
        times.append(time.perf_counter() - t0)
    shape = [(c.start, c.num_tokens, c.samples, list(c.seq.block_table)) for c in chunks]
    for c in chunks:
        bm.free(c.seq)
    return shape, min(times)


def calibrate_grid(
    model: str = "small",
    dtype: str = "float32",
    device: str = "cpu",
    grid: Grid | None = None,
    name: str | None = None,
    log: Callable[[str], None] = print,
    on_progress: Callable[[int, int], None] | None = None,
) -> Calibration:
    """Time every grid point on a ModelRunner (the caller sets torch's threads) and fit
    cost_model.STEP_TERMS to the per-point minima. `on_progress(done, total)` counts the
    grid points timed."""
    from cbbench.reference_engine.execution.model_runner import ModelRunner

    grid = grid or Grid()
    mc = resolve_model_config(model)
    longest = max(max(grid.context_lens), max(grid.prefill_lens))
    if longest > mc.max_position_embeddings:
        raise EngineError(f"context {longest} exceeds the model's {mc.max_position_embeddings}")
    num_blocks = max(
        max(grid.batch_sizes) * -(-max(grid.context_lens) // BLOCK_SIZE),
        -(-max(grid.prefill_lens) // BLOCK_SIZE),
    )
    runner = ModelRunner(model, num_kv_blocks=num_blocks, block_size=BLOCK_SIZE, device=device,
                         dtype=dtype)  # fmt: skip
    cost = CostModel(runner.model_config, HardwareSpec("grid", 1.0, 1.0, 1.0), dtype, BLOCK_SIZE)
    bm = BlockManager(num_blocks, BLOCK_SIZE)
    works, times = [], []
    points = grid.points()
    for kind, b, c in points:
        chunks, t = _time_point(runner, bm, kind, b, c, grid)
        works.append(cost.work(chunks))
        times.append(t)
        log(f"  {kind:7} batch {b:>3} context {c:>5}: {t * 1e3:8.2f} ms")
        if on_progress is not None:
            on_progress(len(times), len(points))
    coef, err = fit_linear(works, times, STEP_TERMS, relative=True)
    short = model.rstrip("/").rsplit("/", 1)[-1]
    spec = measured_spec(
        name or f"measured-{short}-{device.replace(':', '')}",
        coef,
        {"model": model, "device": device, "dtype": dtype, "method": "grid of runner steps, "
         "NNLS on relative error", "points": len(works), **err,
         "measured_steps": step_range(works)},
    )  # fmt: skip
    fitted = CostModel(runner.model_config, spec, dtype, BLOCK_SIZE)
    return Calibration(spec, works, times, [fitted.time_of(w) for w in works])
