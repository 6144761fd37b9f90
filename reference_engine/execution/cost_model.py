"""Modelled step time for the simulator: a roofline over FLOPs and bytes, or a fitted line.

One step computes a set of chunks (query tokens [start, end) of some sequences). Its work:
- FLOPs: 2 x (linear-layer params) per token, 2 x vocab x hidden per sampled token (the LM
  head runs on last positions only), and attention 4 x layers x q_heads x head_dim per
  (query token, context token) pair, causal.
- Bytes: all weights read once per step; per sequence its KV context read once and the new
  tokens' KV written, in `kv_cache_dtype`'s bytes (execution/kv_cache.py; int8: ~1/4 fp32).
- MoE models (moe_cost.py): each active routed expert by its own roofline over its tokens
  (expert parallel: the slowest device per layer); routing uniform or per `MoeSimSettings`.
Roofline, per kernel class (they run one after the other): time = max(dense FLOPs / peak,
weight bytes / bandwidth) + max(attention FLOPs / peak, KV bytes / bandwidth) + overhead + a
per-sequence cost (scheduling, sampling, launches), peak and bandwidth derated by their
efficiencies. A hardware entry may instead carry
`linear` coefficients, fitted from measured steps by `cbbench calibrate`: time = the sum of
coefficient x feature over the coefficients present (STEP_FEATURES names them all). The
features follow what a step costs on the reference engine: a fixed cost per step (Python,
launches), per query token (the linear layers), per sampled token (LM head and sampler), per
sequence (batch preparation, bookkeeping), per prefill chunk (its own attention call),
decode attention as the CPU torch backend lays it out from the block tables
(kernels/kv_layout.py): KV tokens read in place, KV token slots gathered (copied, with
their padding) and attention calls, and prefill attention (query tokens x context per
prefill chunk). Older fits (c0, c_flops, c_bytes, c_seq; c_dec_ctx, the decode context
padded to the batch's longest) still load. `CostModel.step_time(chunks)` is the one stable entry point: the time of one step given its batch.

Over 400 lines because the hardware presets (a calibrated CPU fit with its record) and their
lookup (`get_hardware`, `NAME@F` scaling) sit beside the model whose terms they fill.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
from cbbench.kernels.kv_layout import gather_calls, split_layout
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.gpu_presets import (
    EFFICIENCY_SOURCE,
    FITTED,
    GPU_ALIASES,
    GPU_PRESETS,
    LINKS,
)
from cbbench.reference_engine.execution.kv_cache import kv_token_bytes
from cbbench.reference_engine.execution.moe_cost import MoeCost, MoeSimSettings
from cbbench.reference_engine.model.config import ModelConfig

DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
LINEAR_TERMS = ("c0", "c_flops", "c_bytes", "c_seq")  # the first calibration's terms
# What `cbbench calibrate` fits now (see the module docstring); each is non-negative.
STEP_TERMS = (
    "c0", "c_host", "c_tok", "c_sample", "c_seq", "c_prefill",
    "c_dec_in_place", "c_dec_gathered", "c_dec_calls", "c_pre_ctx", "c_mixed",
)  # fmt: skip
# Terms counted from the decode batch's block tables (kv_layout): a step's work needs them.
LAYOUT_TERMS = ("c_dec_in_place", "c_dec_gathered", "c_dec_calls")


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
    # what a tensor-parallel all-reduce crosses between a replica's GPUs (gpu_presets.LINKS)
    link: str | None = None
    link_bw: float | None = None  # bytes/s one direction per GPU (None: the link's)
    link_latency_s: float | None = None  # seconds per all-reduce (None: the link's)

    def to_dict(self) -> dict:
        return asdict(self)

    def scaled(self, factor: float) -> HardwareSpec:
        """The same hardware with every step `factor` times as long (peaks divided, fixed
        and fitted times multiplied): a plan's interval bounds (harness/studies/planner.py)
        or `--hardware NAME@FACTOR`. A `steps` timeline is one unit a step whatever it is."""
        assert factor > 0, factor
        if self.steps:
            return self
        linear = None if self.linear is None else {t: c * factor for t, c in self.linear.items()}
        return replace(self, name=f"{self.name}@{factor:g}", peak_flops=self.peak_flops / factor,
                       mem_bw=self.mem_bw / factor, step_overhead_s=self.step_overhead_s * factor,
                       per_seq_overhead_s=self.per_seq_overhead_s * factor, linear=linear)  # fmt: skip


HARDWARE_PRESETS: dict[str, HardwareSpec] = {
    **{name: HardwareSpec(name, **kw, **FITTED, fit={"efficiency": EFFICIENCY_SOURCE})
       for name, kw in GPU_PRESETS.items()},
    # Fitted by `cbbench calibrate --validate --validate-workloads chat,uniform` (small, fp32,
    # one torch thread, the "panels" CPU linear kernel and the C++ decode attention / row ops,
    # wall clock; 4,983 whole engine steps of six fit runs, stepped in turn with the held-out
    # runs) on the 2-core CPU this project is developed on (2026-12-02 07:39 UTC). Held-out,
    # throughput / p99 E2E error: chat (B = 8) static +2.2 % / -2.0 %, continuous +0.8 % /
    # -0.2 %; uniform (B = 4) static -4.0 % / +4.2 %, continuous -1.0 % / +1.0 %. With the C++
    # kernel decode attention reads every block in place, so the fit prices in-place and
    # gathered tokens alike and attention calls at zero; the layout terms stay for the torch
    # path. Recalibrate on your machine for anything serious; docs/reproduce.md has the method.
    "cpu-measured": HardwareSpec(
        "cpu-measured",
        peak_flops=33.7e9,
        mem_bw=5.3e9,
        mem_gb=2,
        flops_efficiency=1.0,
        bw_efficiency=1.0,
        gpu_memory_utilization=1.0,
        linear={
            "c0": 1.0317e-02,
            "c_host": 1.0122e-04,
            "c_tok": 1.3770e-03,
            "c_sample": 0.0,
            "c_seq": 8.3935e-06,
            "c_prefill": 0.0,
            "c_dec_in_place": 3.1692e-06,
            "c_dec_gathered": 3.0617e-06,
            "c_dec_calls": 0.0,
            "c_pre_ctx": 6.1320e-07,
        },
        fit={
            "model": "small",
            "device": "cpu",
            "dtype": "float32",
            "clock": "wall",
            "points": 4983,
            "mean_rel_error": 0.133,
            "max_rel_error": 0.867,
            "r2": 0.9630,
            "host_share": 0.0046,
            "speed_drift": [0.716, 1.368],
            "validation": {
                "workloads": ["chat", "uniform"],
                "throughput_error": [0.022, 0.008, -0.040, -0.010],
                "e2e_p99_error": [-0.020, -0.002, 0.042, 0.010],
            },
        },
    ),
    "steps": HardwareSpec("steps", peak_flops=1.0, mem_bw=1.0, mem_gb=1e6, steps=True),
}
HARDWARE_ALIASES = dict(GPU_ALIASES)


def get_hardware(name: str) -> HardwareSpec:
    """A preset name (or alias), or a JSON file written by `cbbench calibrate`; NAME@F is
    NAME with every step F times as long (HardwareSpec.scaled)."""
    base, at, factor = name.rpartition("@")
    if at and base and not Path(name).exists():
        try:
            f = float(factor)
        except ValueError:
            f = float("nan")
        if not (f > 0 and f < float("inf")):
            raise EngineError(f"hardware {name!r}: after @ give a factor > 0 (every step "
                              f"that many times as long)")  # fmt: skip
        return get_hardware(base).scaled(f)
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
    num_samples: int = 0  # chunks that sample a token (LM head rows)
    num_prefill_seqs: int = 0  # chunks of more than one query token
    decode_padded_ctx: int = 0  # decode chunks x their longest context, block-rounded
    # decode attention as laid out by split_layout (all gathered when no block tables given)
    dec_in_place: int = 0  # KV tokens read in place
    dec_gathered: int = 0  # KV token slots copied, padding included
    dec_calls: int = 0  # attention calls (per layer)
    prefill_ctx: int = 0  # sum over prefill chunks of query tokens x context length
    dec_kv: int = 0  # decode chunks' context tokens, unpadded (KV read by a paged kernel)
    attn_flops: float = 0.0  # the attention part of `flops`
    kv_bytes: float = 0.0  # the KV part of `bytes` (the rest: weights)
    # MoE (moe_cost.py): one sparse layer's (tokens per expert, P(active)); their FLOPs, bytes
    expert_load: tuple[np.ndarray, np.ndarray] | None = None
    moe_flops: float = 0.0
    moe_bytes: float = 0.0

    def feature(self, term: str) -> float:
        return float(STEP_FEATURES[term](self))

    def features(self, terms: tuple[str, ...] = LINEAR_TERMS) -> list[float]:
        return [self.feature(t) for t in terms]


STEP_FEATURES = {
    "c0": lambda w: 1.0,
    "c_host": lambda w: 1.0,  # the host's share of the fixed cost (async scheduling hides it)
    "c_flops": lambda w: w.flops,
    "c_bytes": lambda w: w.bytes,
    "c_tok": lambda w: w.num_tokens,
    "c_sample": lambda w: w.num_samples,
    "c_seq": lambda w: w.num_seqs,
    "c_prefill": lambda w: w.num_prefill_seqs,
    "c_dec_ctx": lambda w: w.decode_padded_ctx,
    "c_dec_in_place": lambda w: w.dec_in_place,
    "c_dec_gathered": lambda w: w.dec_gathered,
    "c_dec_calls": lambda w: w.dec_calls,
    "c_pre_ctx": lambda w: w.prefill_ctx,
    "c_dec_kv": lambda w: w.dec_kv,  # a black-box fit's decode attention (sim/run_fit.py)
    "c_mixed": lambda w: float(0 < w.num_prefill_seqs < w.num_seqs),  # prefills + decodes
}


class CostModel:
    def __init__(self, model_config: ModelConfig, hardware: HardwareSpec, dtype: str,
                 block_size: int = 16, moe: MoeSimSettings | None = None,
                 kv_cache_dtype: str = "auto", tensor_parallel: int = 1) -> None:  # fmt: skip
        if dtype not in DTYPE_BYTES:
            raise EngineError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPE_BYTES)})")
        self.model_config = model_config
        self.hardware = hardware
        self.dtype_bytes = DTYPE_BYTES[dtype]
        self.tp = tensor_parallel
        self._tp_check(tensor_parallel)
        mc = model_config
        vh = mc.vocab_size * mc.hidden_size
        self.params = mc.num_params()
        # embedding lookups cost no FLOPs; the LM head only runs on sampled positions
        self.linear_params = self.params - vh - (0 if mc.tie_word_embeddings else vh)
        self.head_flops = 2.0 * vh
        assert mc.head_dim is not None
        self.attn_flops_per_pair = 4.0 * mc.num_hidden_layers * mc.num_attention_heads * mc.head_dim
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_bytes_per_token = kv_token_bytes(mc, kv_cache_dtype, self.dtype_bytes)
        self.weight_bytes = float(self.params * self.dtype_bytes)
        ep = (moe or MoeSimSettings()).expert_parallel
        self.moe = MoeCost(mc, self.dtype_bytes, ep) if mc.is_moe else None
        routed = self.moe.routed_params if self.moe is not None else 0  # priced per expert
        self.linear_params -= routed
        self.step_weight_bytes = float((self.params - routed) * self.dtype_bytes)  # every step
        self.device_weight_bytes = self.step_weight_bytes + routed * self.dtype_bytes / ep
        self.block_size = block_size
        # one token / one block of K of one layer, as the CPU backend's layout counts them
        self.k_token_bytes = self.kv_bytes_per_token // (2 * mc.num_hidden_layers)
        lin = hardware.linear or {}
        # whether step times depend on the block tables (then pass them to `work`)
        self.uses_layout = any(lin.get(t, 0.0) for t in LAYOUT_TERMS)
        if hardware.linear is not None:
            unknown = sorted(set(hardware.linear) - set(STEP_FEATURES))
            if unknown:
                raise EngineError(
                    f"hardware {hardware.name}: unknown cost terms {unknown} (known: "
                    f"{', '.join(STEP_FEATURES)})"
                )

    def work(
        self, chunks: Iterable[tuple], expert_load: tuple[np.ndarray, np.ndarray] | None = None
    ) -> StepWork:
        """Work of a step given (start, num_tokens, samples) per sequence, optionally with
        the sequence's block table as a 4th item (decode attention's layout needs them).
        MoE models: `expert_load` (tokens per expert, P(active)) from ExpertRouting, else
        uniform routing."""
        w = StepWork()
        pairs = 0
        kv_tokens = 0
        samples = 0
        longest_decode = 0
        dec_lens: list[int] = []
        tables: list[list[int]] | None = []
        for start, n, sample, *table in chunks:
            end = start + n
            w.num_tokens += n
            w.num_seqs += 1
            pairs += (end * (end + 1) - start * (start + 1)) // 2
            kv_tokens += end + n  # read the context, write the new tokens
            samples += bool(sample)
            if n == 1:
                dec_lens.append(end)
                longest_decode = max(longest_decode, end)
                if tables is not None and table and table[0] is not None:
                    tables.append(table[0])
                else:
                    tables = None
            else:
                w.num_prefill_seqs += 1
                w.prefill_ctx += n * end
        bs = self.block_size
        w.num_samples = samples
        w.decode_padded_ctx = len(dec_lens) * -(-longest_decode // bs) * bs
        w.dec_kv = sum(dec_lens)
        if dec_lens:
            layout = None
            if tables is not None:
                layout = split_layout(tables, dec_lens, bs, bs * self.k_token_bytes)
            if layout is None:  # everything gathered, padded to the longest
                w.dec_gathered = w.decode_padded_ctx
                w.dec_calls = gather_calls(len(dec_lens), w.decode_padded_ctx // len(dec_lens),
                                           self.k_token_bytes)  # fmt: skip
            else:
                w.dec_in_place, w.dec_gathered, w.dec_calls = layout.counts(bs)
        w.attn_flops = self.attn_flops_per_pair * pairs
        w.flops = 2.0 * self.linear_params * w.num_tokens + self.head_flops * samples + w.attn_flops
        w.kv_bytes = float(kv_tokens * self.kv_bytes_per_token)
        w.bytes = self.step_weight_bytes + w.kv_bytes
        if self.moe is not None:
            self.moe.add_work(w, expert_load)
        return w

    def split_time(self, w: StepWork) -> tuple[float, float]:
        """(device, host) seconds of a step. The per-sequence term (`per_seq_overhead_s`,
        or a fitted `c_seq`, plus a fitted fixed `c_host`) is host work: scheduling, input
        preparation, output processing; the rest is the device's."""
        total, host = self._total_and_host(w)
        return total - host, host

    def _total_and_host(self, w: StepWork) -> tuple[float, float]:
        hw = self.hardware
        if hw.steps:
            return 1.0, 0.0
        if w.num_seqs == 0:
            return 0.0, 0.0
        if hw.linear is not None:
            total = max(0.0, sum(c * w.feature(t) for t, c in hw.linear.items()))
            host = hw.linear.get("c_host", 0.0) + hw.linear.get("c_seq", 0.0) * w.num_seqs
            return total, min(total, host)
        # Kernels run one after the other, each bound by its own roofline: the dense layers
        # (weights read once, FLOPs per token) and attention (KV read, FLOPs per pair). A
        # decode's KV read is not hidden under a compute-bound prefill in the same step.
        peak, bw = hw.peak_flops * hw.flops_efficiency, hw.mem_bw * hw.bw_efficiency
        ep = self.moe.expert_parallel if self.moe is not None else 1  # EP: data-parallel rest
        dense_flops = (w.flops - w.attn_flops - w.moe_flops) / ep
        dense = max(dense_flops / peak, (w.bytes - w.kv_bytes - w.moe_bytes) / bw)
        attention = max(w.attn_flops / ep / peak, w.kv_bytes / ep / bw)
        dense += self.moe.time(w, peak, bw) if self.moe is not None else 0.0
        host = hw.per_seq_overhead_s * w.num_seqs
        if self.tp > 1:  # weights and heads sharded; two all-reduces a layer
            return (dense / self.tp + attention / self.tp + self.allreduce_s(w.num_tokens)
                    + hw.step_overhead_s + host), host  # fmt: skip
        return dense + attention + hw.step_overhead_s + host, host

    def time_of(self, w: StepWork, overlap_host: bool = False) -> float:
        """Step time: device + host; with `overlap_host` (async scheduling) the host work
        runs while the device computes the previous step, so max(device, host)."""
        total, host = self._total_and_host(w)
        return max(total - host, host) if overlap_host else total

    def step_time(self, chunks: Iterable[tuple[int, int, bool]]) -> float:
        """Seconds one step takes given its batch: (start, num_tokens, samples) per chunk."""
        return self.time_of(self.work(chunks))

    def kv_pool_blocks(self, block_size: int) -> int:
        """KV blocks that fit the device after the weights (simulated devices only); with
        tensor parallelism the weights and the KV heads are split over the replica's GPUs."""
        hw = self.hardware
        if hw.steps:
            return 1 << 16
        weights = self.device_weight_bytes / self.tp
        free = hw.mem_gb * 1e9 * hw.gpu_memory_utilization - weights
        ep = self.moe.expert_parallel if self.moe is not None else 1  # a KV pool per device
        n = int(ep * self.tp * free // (self.kv_bytes_per_token * block_size))
        if n < 1:
            tp = f" at tensor parallel {self.tp}" if self.tp > 1 else ""
            raise EngineError(
                f"model weights ({weights / 1e9:.1f} GB per device{tp}) do not leave room "
                f"for a KV cache on {hw.name} ({hw.mem_gb} GB): raise --tensor-parallel-size"
            )
        return n

    def link(self) -> tuple[float, float]:
        """(bytes/s, seconds per all-reduce) of the link between a replica's GPUs."""
        hw = self.hardware
        bw, lat = LINKS.get(hw.link or "pcie4", LINKS["pcie4"])
        return (hw.link_bw or bw), (hw.link_latency_s if hw.link_latency_s is not None else lat)

    def allreduce_s(self, num_tokens: int) -> float:
        """A step's tensor-parallel all-reduces: two a layer (after attention, after the MLP)
        of the step's activations, ring-reduced: 2 (tp - 1) / tp of the bytes cross each
        GPU's link, plus a latency per all-reduce."""
        if self.tp <= 1:
            return 0.0
        bw, lat = self.link()
        nbytes = num_tokens * self.model_config.hidden_size * self.dtype_bytes
        per = lat + 2.0 * (self.tp - 1) / self.tp * nbytes / bw
        return 2 * self.model_config.num_hidden_layers * per

    def _tp_check(self, tp: int) -> None:
        if tp < 1:
            raise EngineError(f"tensor_parallel_size must be >= 1, got {tp}")
        mc, hw = self.model_config, self.hardware
        if tp > 1 and mc.num_attention_heads % tp:
            raise EngineError(f"tensor_parallel_size {tp} does not divide the model's "
                              f"{mc.num_attention_heads} attention heads")  # fmt: skip
        fitted = (hw.fit or {}).get("tensor_parallel_size", 1)
        if hw.linear is not None and tp != fitted:
            raise EngineError(
                f"hardware {hw.name} was fitted at tensor parallel {fitted}: a fit prices the "
                f"steps it measured; simulate with --tensor-parallel-size {fitted}, or fit "
                f"runs served at {tp}"
            )  # fmt: skip


def min_tensor_parallel(model_config: ModelConfig, hardware: HardwareSpec, dtype: str,
                        block_size: int = 16, sizes=(1, 2, 4, 8)) -> int | None:  # fmt: skip
    """The smallest tensor-parallel size in `sizes` whose GPUs hold the weights and some KV
    cache (at least one max-length sequence's worth); None when none does."""
    for tp in sizes:
        try:
            c = CostModel(model_config, hardware, dtype, block_size, tensor_parallel=tp)
            need = -(-model_config.max_position_embeddings // block_size)
            if c.kv_pool_blocks(block_size) >= min(need, 1024):
                return tp
        except EngineError:
            continue
    return None


def nnls(A: np.ndarray, b: np.ndarray, max_iter: int = 500) -> np.ndarray:
    """argmin ||A x - b|| subject to x >= 0 (Lawson-Hanson active set)."""
    m, n = A.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 1e-12 * max(1.0, float(np.abs(A).max(initial=0.0)))
    for _ in range(max_iter):
        grad = A.T @ (b - A @ x)
        free = ~passive & (grad > tol)
        if not free.any():
            break
        passive[int(np.argmax(np.where(free, grad, -np.inf)))] = True
        while True:
            z = np.zeros(n)
            z[passive], *_ = np.linalg.lstsq(A[:, passive], b, rcond=None)
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = float(np.min(x[neg] / np.maximum(x[neg] - z[neg], 1e-300)))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
    return x


def fit_linear(
    works: list[StepWork],
    times: list[float],
    terms: tuple[str, ...] = LINEAR_TERMS,
    relative: bool = True,
) -> tuple[dict[str, float], dict[str, float]]:
    """Least-squares fit of a linear step-time model with non-negative coefficients (NNLS)
    over `terms`. relative=True minimises the relative error per step (step times span orders
    of magnitude); relative=False the absolute one, which is what a run's total time (hence
    its throughput) sums, so fits from real step traces use it. Returns coefficients and the
    fit error on the samples (mean and max relative error, R^2, and the error of the summed
    time)."""
    assert len(works) == len(times) and len(works) >= 1
    X = np.array([w.features(terms) for w in works], dtype=np.float64)
    y = np.array(times, dtype=np.float64)
    assert (y > 0).all()
    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0
    if relative:
        coef = nnls(X / scale / y[:, None], np.ones_like(y))
    else:
        coef = nnls(X / scale / y.mean(), y / y.mean())
    coef = coef / scale
    pred = X @ coef
    rel = np.abs(pred - y) / np.maximum(y, 1e-12)
    ss_res = float(((pred - y) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum()) or 1e-30
    err = {
        "mean_rel_error": float(rel.mean()),
        "max_rel_error": float(rel.max()),
        "r2": 1.0 - ss_res / ss_tot,
        "total_time_error": float(pred.sum() / y.sum() - 1.0),
    }
    return dict(zip(terms, map(float, coef), strict=True)), err
