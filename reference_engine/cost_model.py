"""Modelled step time for the simulator: a roofline over FLOPs and bytes, or a fitted line.

One step computes a set of chunks (query tokens [start, end) of some sequences). Its work:
- FLOPs: 2 x (linear-layer params) per token, 2 x vocab x hidden per sampled token (the LM
  head runs on last positions only), and attention 4 x layers x q_heads x head_dim per
  (query token, context token) pair, causal.
- Bytes: all weights read once per step; per sequence its KV context read once and the new
  tokens' KV written.
Roofline: time = max(FLOPs / (peak_flops x eff), bytes / (mem_bw x eff)) + overhead + a
per-sequence cost (scheduling, sampling, launches). A hardware entry may instead carry
`linear` coefficients, fitted from measured steps by `cbbench calibrate`:
time = c0 + c_flops x FLOPs + c_bytes x bytes + c_seq x sequences.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.model_config import ModelConfig

DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
LINEAR_TERMS = ("c0", "c_flops", "c_bytes", "c_seq")


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    peak_flops: float  # dense FLOP/s at the simulated dtype
    mem_bw: float  # bytes/s
    mem_gb: float  # device memory (weights + KV pool)
    flops_efficiency: float = 0.6
    bw_efficiency: float = 0.8
    step_overhead_s: float = 0.002
    per_seq_overhead_s: float = 2e-5
    gpu_memory_utilization: float = 0.9
    linear: dict[str, float] | None = None  # fitted coefficients (LINEAR_TERMS) replace roofline
    fit: dict = field(default_factory=dict)  # how `linear` was obtained (model, error, grid)
    steps: bool = False  # one time unit per step, whatever its work (the seed-demo timeline)

    def to_dict(self) -> dict:
        return asdict(self)


HARDWARE_PRESETS: dict[str, HardwareSpec] = {
    "a100-80g": HardwareSpec("a100-80g", peak_flops=312e12, mem_bw=2.039e12, mem_gb=80),
    "h100-sxm": HardwareSpec("h100-sxm", peak_flops=989e12, mem_bw=3.35e12, mem_gb=80),
    "h200": HardwareSpec("h200", peak_flops=989e12, mem_bw=4.8e12, mem_gb=141),
    # Fitted by `cbbench calibrate --model small --threads 1` (fp32) on the 2-core CI-class
    # CPU this project is developed on, while other jobs shared it: 12 points, mean error 18 %,
    # max 39 %, R^2 0.90. Recalibrate on your machine for anything serious.
    "cpu-measured": HardwareSpec(
        "cpu-measured",
        peak_flops=33.7e9,
        mem_bw=5.3e9,
        mem_gb=2,
        flops_efficiency=1.0,
        bw_efficiency=1.0,
        gpu_memory_utilization=1.0,
        linear={"c0": 0.0, "c_flops": 2.964e-11, "c_bytes": 1.884e-10, "c_seq": 1.369e-3},
        fit={
            "model": "small",
            "device": "cpu",
            "dtype": "float32",
            "points": 12,
            "mean_rel_error": 0.182,
            "max_rel_error": 0.388,
            "r2": 0.900,
        },
    ),
    "steps": HardwareSpec("steps", peak_flops=1.0, mem_bw=1.0, mem_gb=1e6, steps=True),
}
HARDWARE_ALIASES = {"h100": "h100-sxm", "a100": "a100-80g"}


def get_hardware(name: str) -> HardwareSpec:
    """A preset name (or alias), or a JSON file written by `cbbench calibrate`."""
    key = HARDWARE_ALIASES.get(name, name)
    if key in HARDWARE_PRESETS:
        return HARDWARE_PRESETS[key]
    p = Path(name)
    if p.suffix == ".json" or p.exists():
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise EngineError(f"hardware file {p}: no such file") from None
        except json.JSONDecodeError as exc:
            raise EngineError(f"hardware file {p}: not valid JSON ({exc.msg})") from None
        try:
            return HardwareSpec(**d)
        except TypeError as exc:
            raise EngineError(f"hardware file {p}: {exc}") from None
    known = ", ".join([*HARDWARE_PRESETS, *HARDWARE_ALIASES])
    raise EngineError(f"unknown hardware {name!r} (known: {known}, or a calibrate JSON path)")


@dataclass
class StepWork:
    flops: float = 0.0
    bytes: float = 0.0
    num_tokens: int = 0
    num_seqs: int = 0

    def features(self) -> list[float]:
        return [1.0, self.flops, self.bytes, float(self.num_seqs)]


class CostModel:
    def __init__(self, model_config: ModelConfig, hardware: HardwareSpec, dtype: str) -> None:
        if dtype not in DTYPE_BYTES:
            raise EngineError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPE_BYTES)})")
        self.model_config = model_config
        self.hardware = hardware
        self.dtype_bytes = DTYPE_BYTES[dtype]
        mc = model_config
        vh = mc.vocab_size * mc.hidden_size
        self.params = mc.num_params()
        # embedding lookups cost no FLOPs; the LM head only runs on sampled positions
        self.linear_params = self.params - vh - (0 if mc.tie_word_embeddings else vh)
        self.head_flops = 2.0 * vh
        assert mc.head_dim is not None
        self.attn_flops_per_pair = 4.0 * mc.num_hidden_layers * mc.num_attention_heads * mc.head_dim
        self.kv_bytes_per_token = mc.kv_bytes_per_token(self.dtype_bytes)
        self.weight_bytes = float(self.params * self.dtype_bytes)

    def work(self, chunks: Iterable[tuple[int, int, bool]]) -> StepWork:
        """Work of a step given (start, num_tokens, samples) per sequence."""
        w = StepWork()
        pairs = 0
        kv_tokens = 0
        samples = 0
        for start, n, sample in chunks:
            end = start + n
            w.num_tokens += n
            w.num_seqs += 1
            pairs += (end * (end + 1) - start * (start + 1)) // 2
            kv_tokens += end + n  # read the context, write the new tokens
            samples += bool(sample)
        w.flops = (
            2.0 * self.linear_params * w.num_tokens
            + self.head_flops * samples
            + self.attn_flops_per_pair * pairs
        )
        w.bytes = self.weight_bytes + float(kv_tokens * self.kv_bytes_per_token)
        return w

    def time_of(self, w: StepWork) -> float:
        hw = self.hardware
        if hw.steps:
            return 1.0
        if w.num_seqs == 0:
            return 0.0
        if hw.linear is not None:
            c = hw.linear
            return max(
                0.0,
                c["c0"] + c["c_flops"] * w.flops + c["c_bytes"] * w.bytes + c["c_seq"] * w.num_seqs,
            )
        compute = w.flops / (hw.peak_flops * hw.flops_efficiency)
        memory = w.bytes / (hw.mem_bw * hw.bw_efficiency)
        return max(compute, memory) + hw.step_overhead_s + hw.per_seq_overhead_s * w.num_seqs

    def step_time(self, chunks: Iterable[tuple[int, int, bool]]) -> float:
        return self.time_of(self.work(chunks))

    def kv_pool_blocks(self, block_size: int) -> int:
        """KV blocks that fit the device after the weights (simulated devices only)."""
        hw = self.hardware
        if hw.steps:
            return 1 << 16
        free = hw.mem_gb * 1e9 * hw.gpu_memory_utilization - self.weight_bytes
        n = int(free // (self.kv_bytes_per_token * block_size))
        if n < 1:
            raise EngineError(
                f"model weights ({self.weight_bytes / 1e9:.1f} GB) do not leave room for a KV "
                f"cache on {hw.name} ({hw.mem_gb} GB)"
            )
        return n


def fit_linear(
    works: list[StepWork], times: list[float]
) -> tuple[dict[str, float], dict[str, float]]:
    """Least-squares fit of the linear step-time model with non-negative coefficients
    (terms that come out negative are dropped and the rest refitted), minimising the
    *relative* error, since step times span orders of magnitude. Returns coefficients and
    the fit error on the samples (mean and max relative error, R^2)."""
    assert len(works) == len(times) and len(works) >= len(LINEAR_TERMS)
    X = np.array([w.features() for w in works], dtype=np.float64)
    y = np.array(times, dtype=np.float64)
    assert (y > 0).all()
    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0
    Xs = X / scale / y[:, None]  # row i divided by y_i: residuals become relative
    ones = np.ones_like(y)
    active = list(range(X.shape[1]))
    coef = np.zeros(X.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(Xs[:, active], ones, rcond=None)
        if (sol >= 0).all():
            coef[:] = 0
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    coef = coef / scale
    pred = X @ coef
    rel = np.abs(pred - y) / np.maximum(y, 1e-12)
    ss_res = float(((pred - y) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum()) or 1e-30
    err = {
        "mean_rel_error": float(rel.mean()),
        "max_rel_error": float(rel.max()),
        "r2": 1.0 - ss_res / ss_tot,
    }
    return dict(zip(LINEAR_TERMS, map(float, coef), strict=True)), err
