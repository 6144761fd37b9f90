"""`cbbench calibrate`: measure the real executor's step times, fit the simulator's cost model.

Steps are timed over a small grid (decode batches x context lengths, and prefill chunks) on
the real ModelRunner; the linear step-time model of cost_model.py is fitted by least squares
and saved as a hardware JSON that `cbbench sim --hardware PATH` (or `cpu-measured`, which
ships a fit from a 2-core CPU) uses. The fit's error is printed per grid point.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from cbbench.reference_engine.block_manager import BlockManager
from cbbench.reference_engine.cost_model import CostModel, HardwareSpec, StepWork, fit_linear
from cbbench.reference_engine.engine import resolve_model_config
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.executor import ScheduledChunk
from cbbench.reference_engine.options import add_engine_args, engine_value
from cbbench.reference_engine.outputs import RequestMetrics
from cbbench.reference_engine.sampling_params import SamplingParams
from cbbench.reference_engine.sequence import Sequence


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        help="fit the simulator's cost model to measured reference-engine step times",
        description="Time the real model runner over a grid of batch sizes and context "
        "lengths, fit the simulator's step-time model (least squares) and save it as a "
        "hardware JSON for `cbbench sim --hardware PATH`.",
    )
    add_engine_args(
        p, only=("model", "device", "dtype"), defaults={"model": "small", "dtype": "float32"}
    )
    p.add_argument("--batch-sizes", default="1,4,16", help="decode batch sizes")
    p.add_argument("--context-lens", default="32,256,1024", help="decode context lengths")
    p.add_argument("--prefill-lens", default="32,128,512", help="single-prefill chunk lengths")
    p.add_argument("--repeats", type=int, default=3, help="min timed runs per grid point")
    p.add_argument("--min-time", type=float, default=0.3,
                   help="keep repeating a grid point up to this many seconds (max 30 runs)")  # fmt: skip
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all)")
    p.add_argument("--name", default=None, help="hardware name in the JSON")
    p.add_argument("--out", default=None, help="JSON path (default: calibration-MODEL-DEVICE.json)")
    p.set_defaults(func=run)


def _ints(text: str, flag: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise EngineError(f"{flag}: expected a comma list of integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise EngineError(f"{flag}: expected positive integers, got {text!r}")
    return vals


@dataclasses.dataclass
class Point:
    kind: str  # "decode" | "prefill"
    batch: int
    context: int
    work: StepWork
    measured_s: float


def _batch(bm: BlockManager, batch: int, context: int, decode: bool) -> list[ScheduledChunk]:
    """`batch` sequences of `context` tokens: decode = the last token to compute (the rest
    counts as cached), prefill = all of them."""
    chunks = []
    for i in range(batch):
        seq = Sequence(f"c{i}", [1 + (i + j) % 97 for j in range(context)], SamplingParams(
            max_tokens=1, temperature=0.0), RequestMetrics(0.0))  # fmt: skip
        if not bm.allocate_slots(seq, context):
            raise EngineError(f"calibration grid point {batch}x{context} does not fit the KV cache")
        if decode:
            seq.num_computed_tokens = context - 1
        chunks.append(ScheduledChunk(seq, context - seq.num_computed_tokens))
    return chunks


def measure(runner, cost: CostModel, bm: BlockManager, kind: str, batch: int, context: int,
            repeats: int, min_time_s: float) -> Point:  # fmt: skip
    chunks = _batch(bm, batch, context, decode=kind == "decode")
    runner.execute(chunks)  # warm-up
    times: list[float] = []
    start = time.perf_counter()
    # at least `repeats` runs, more for cheap steps (up to min_time_s, 30 runs): the minimum
    # is the estimate least disturbed by other processes on the machine
    while len(times) < repeats or (time.perf_counter() - start < min_time_s and len(times) < 30):
        t0 = time.perf_counter()
        runner.execute(chunks)
        times.append(time.perf_counter() - t0)
    for c in chunks:
        bm.free(c.seq)
    work = cost.work((c.start, c.num_tokens, c.samples) for c in chunks)
    return Point(kind, batch, context, work, min(times))


def calibrate(args: argparse.Namespace, log=print) -> tuple[HardwareSpec, list[Point], list[float]]:
    from cbbench.reference_engine.model_runner import ModelRunner

    batches = _ints(args.batch_sizes, "--batch-sizes")
    contexts = _ints(args.context_lens, "--context-lens")
    prefills = _ints(args.prefill_lens, "--prefill-lens")
    if args.repeats < 1:
        raise EngineError(f"--repeats must be >= 1, got {args.repeats}")
    mc = resolve_model_config(args.model)
    longest = max(max(contexts), max(prefills))
    if longest > mc.max_position_embeddings:
        raise EngineError(f"context {longest} exceeds the model's {mc.max_position_embeddings}")
    block_size = 16
    num_blocks = max(
        max(batches) * -(-max(contexts) // block_size), -(-max(prefills) // block_size)
    )
    runner = ModelRunner(args.model, num_kv_blocks=num_blocks, block_size=block_size,
                         device=args.device, dtype=args.dtype,
                         num_threads=args.threads)  # fmt: skip
    base = HardwareSpec(
        args.name or f"measured-{Path(args.model).name}-{args.device}", 1.0, 1.0, 1.0
    )
    cost = CostModel(runner.model_config, base, args.dtype)
    bm = BlockManager(num_blocks, block_size)
    grid = [("decode", b, c) for b in batches for c in contexts]
    grid += [("prefill", 1, n) for n in prefills]
    points = []
    for kind, b, c in grid:
        points.append(measure(runner, cost, bm, kind, b, c, args.repeats, args.min_time))
        log(f"  {kind:7} batch {b:>3} context {c:>5}: {points[-1].measured_s * 1e3:8.2f} ms")
    coef, err = fit_linear([p.work for p in points], [p.measured_s for p in points])
    spec = dataclasses.replace(
        base,
        mem_gb=2.0,
        flops_efficiency=1.0,
        bw_efficiency=1.0,
        gpu_memory_utilization=1.0,
        linear=coef,
        fit={
            "model": args.model,
            "device": args.device,
            "dtype": args.dtype,
            "points": len(points),
            **err,
        },
    )
    fitted = CostModel(runner.model_config, spec, args.dtype)
    return spec, points, [fitted.time_of(p.work) for p in points]


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    for dest in ("model", "device", "dtype"):
        setattr(args, dest, engine_value(args, dest))
    console = Console()
    console.print(f"calibrating {args.model} on {args.device} ({args.dtype})")
    spec, points, predicted = calibrate(args, log=console.print)
    t = Table(title=f"step time: measured vs fitted ({spec.name})")
    for col in ("step", "batch", "context", "measured ms", "fitted ms", "error"):
        t.add_column(col, justify="right")
    for p, pred in zip(points, predicted, strict=True):
        t.add_row(p.kind, str(p.batch), str(p.context), f"{p.measured_s * 1e3:.2f}",
                  f"{pred * 1e3:.2f}", f"{(pred - p.measured_s) / p.measured_s:+.1%}")  # fmt: skip
    console.print(t)
    assert spec.linear is not None
    c = spec.linear
    console.print(
        f"fit: t = {c['c0'] * 1e3:.3f} ms + FLOPs / {1 / c['c_flops'] / 1e9 if c['c_flops'] else float('inf'):.1f} GFLOP/s"
        f" + bytes / {1 / c['c_bytes'] / 1e9 if c['c_bytes'] else float('inf'):.1f} GB/s"
        f" + {c['c_seq'] * 1e3:.3f} ms per sequence"
    )
    console.print(
        f"fit error: mean {spec.fit['mean_rel_error']:.1%}, max {spec.fit['max_rel_error']:.1%}, "
        f"R^2 {spec.fit['r2']:.4f}"
    )
    out = Path(args.out or f"calibration-{Path(args.model).name}-{args.device}.json")
    out.write_text(json.dumps(spec.to_dict(), indent=2) + "\n", encoding="utf-8")
    console.print(f"saved {out}: use `cbbench sim --hardware {out}`")
    return 0
