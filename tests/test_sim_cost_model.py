"""The simulator's step-time model: roofline regimes, presets, and the least-squares fit."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.cost_model import (
    HARDWARE_PRESETS,
    STEP_TERMS,
    CostModel,
    HardwareSpec,
    StepWork,
    fit_linear,
    get_hardware,
)
from cbbench.reference_engine.model.config import preset_config

LLAMA = preset_config("llama-3-8b")


def model(hw: str = "h100") -> CostModel:
    return CostModel(LLAMA, get_hardware(hw), "bfloat16")


def test_small_decode_is_memory_bound_on_the_weights():
    cm = model()
    hw = cm.hardware
    t = cm.step_time([(100, 1, True)])
    weights_time = cm.weight_bytes / (hw.mem_bw * hw.bw_efficiency)
    assert cm.weight_bytes == pytest.approx(LLAMA.num_params() * 2)
    assert weights_time < t < weights_time * 1.02 + hw.step_overhead_s + hw.per_seq_overhead_s
    # batching decodes is almost free while memory-bound
    t32 = cm.step_time([(100, 1, True)] * 32)
    assert t32 / t < 1.2


def test_long_prefill_is_compute_bound():
    cm = model()
    hw = cm.hardware
    w = cm.work([(0, 8000, True)])
    assert w.flops / (hw.peak_flops * hw.flops_efficiency) > w.bytes / (
        hw.mem_bw * hw.bw_efficiency
    )
    # 2 FLOPs per linear param per token dominate, attention adds the causal square
    assert w.flops > 2 * cm.linear_params * 8000
    assert cm.step_time([(0, 8000, True)]) > 10 * cm.step_time([(0, 100, True)])


def test_work_counts_attention_pairs_and_kv_traffic():
    cm = model()
    one = cm.work([(10, 1, True)])  # position 10 attends to 11 tokens
    pairs_flops = one.flops - 2 * cm.linear_params - cm.head_flops
    assert pairs_flops == pytest.approx(cm.attn_flops_per_pair * 11)
    chunk = cm.work([(4, 3, False)])  # positions 4,5,6: 5+6+7 pairs, no LM head
    assert chunk.flops - 6 * cm.linear_params == pytest.approx(cm.attn_flops_per_pair * 18)
    assert chunk.bytes - cm.weight_bytes == (7 + 3) * cm.kv_bytes_per_token


def test_faster_memory_means_faster_decode():
    step = [(500, 1, True)] * 16
    assert model("h200").step_time(step) < model("h100").step_time(step)
    assert model("h100").step_time(step) < model("a100-80g").step_time(step)


def test_steps_mode_and_empty_steps():
    assert model("steps").step_time([(0, 500, True)]) == 1.0
    assert model().step_time([]) == 0.0


def test_hardware_names_aliases_and_json(tmp_path):
    assert get_hardware("h100") is HARDWARE_PRESETS["h100-sxm"]
    spec = HardwareSpec(
        "mine", 1e12, 1e11, 16, linear={"c0": 1, "c_flops": 0, "c_bytes": 0, "c_seq": 0}
    )
    p = tmp_path / "hw.json"
    p.write_text(json.dumps(spec.to_dict()))
    assert get_hardware(str(p)) == spec
    assert CostModel(LLAMA, spec, "float32").step_time([(0, 4, True)]) == 1.0
    with pytest.raises(EngineError, match="unknown hardware 'tpu'"):
        get_hardware("tpu")
    p.write_text("{")
    with pytest.raises(EngineError, match="not valid JSON"):
        get_hardware(str(p))


def test_kv_pool_fits_the_device_after_the_weights():
    cm = model("h100")
    blocks = cm.kv_pool_blocks(16)
    kv_gb = blocks * 16 * cm.kv_bytes_per_token / 1e9
    assert 50 < kv_gb + cm.weight_bytes / 1e9 <= 80 * 0.9
    with pytest.raises(EngineError, match="do not leave room"):
        CostModel(LLAMA, HardwareSpec("small", 1e12, 1e11, 10), "bfloat16").kv_pool_blocks(16)


def test_fit_recovers_known_coefficients():
    rng = np.random.default_rng(0)
    true = {"c0": 0.003, "c_flops": 2e-11, "c_bytes": 1e-10, "c_seq": 1e-4}
    works = [
        StepWork(flops=float(f), bytes=float(b), num_seqs=int(s))
        for f, b, s in zip(
            rng.uniform(1e8, 1e11, 30),
            rng.uniform(1e7, 1e9, 30),
            rng.integers(1, 32, 30),
            strict=True,
        )
    ]
    times = [
        true["c0"]
        + true["c_flops"] * w.flops
        + true["c_bytes"] * w.bytes
        + true["c_seq"] * w.num_seqs
        for w in works
    ]
    coef, err = fit_linear(works, times)
    for k, v in true.items():
        assert coef[k] == pytest.approx(v, rel=1e-6)
    assert err["max_rel_error"] < 1e-6 and err["r2"] > 0.999999


def test_fit_drops_terms_that_would_be_negative():
    works = [StepWork(flops=float(i), bytes=float(100 - i), num_seqs=1) for i in range(1, 20)]
    times = [0.01 + 1e-3 * w.flops - 1e-5 * w.bytes for w in works]  # a negative bytes term
    coef, _ = fit_linear(works, times)
    assert all(v >= 0 for v in coef.values())


def test_step_features_follow_the_batch():
    """The calibrated model's features: decode attention over the padded context, prefill
    attention per (query, context) pair, samples and prefill chunks counted apart."""
    cm = CostModel(LLAMA, HARDWARE_PRESETS["h100-sxm"], "bfloat16", block_size=16)
    w = cm.work([(99, 1, True), (9, 1, True), (0, 50, True), (50, 30, False)])
    assert (w.num_seqs, w.num_tokens, w.num_samples, w.num_prefill_seqs) == (4, 82, 3, 2)
    assert w.decode_padded_ctx == 2 * 112  # two decodes padded to 100 -> 7 blocks of 16
    assert w.prefill_ctx == 50 * 50 + 30 * 80


def test_fitted_step_terms_price_a_step():
    spec = HardwareSpec("fit", 1.0, 1.0, 1.0, linear={t: 0.0 for t in STEP_TERMS})
    spec.linear.update(c0=0.01, c_tok=1e-4, c_dec_ctx=1e-6)
    cm = CostModel(LLAMA, spec, "float32")
    assert cm.step_time([(99, 1, True)] * 4) == pytest.approx(0.01 + 4e-4 + 4 * 112e-6)
    bad = HardwareSpec("bad", 1.0, 1.0, 1.0, linear={"c_warp": 1.0})
    with pytest.raises(EngineError, match=r"unknown cost terms \['c_warp'\]"):
        CostModel(LLAMA, bad, "float32")


def test_roofline_does_not_hide_decode_reads_under_a_prefill():
    """Kernels run in turn: a decode's KV read adds to a prefill step's compute-bound
    dense layers (16 short prompts, 4096 tokens)."""
    cm = model("h100")
    prefill = [(0, 256, True)] * 16
    decodes = [(2000, 1, True)] * 64
    assert cm.step_time(prefill + decodes) > cm.step_time(prefill) + 0.5 * (
        cm.step_time(decodes) - cm.hardware.step_overhead_s
    )


def test_nnls_absolute_fit_keeps_the_total_time():
    rng = np.random.default_rng(1)
    works = [StepWork(num_seqs=int(s), num_tokens=int(s)) for s in rng.integers(1, 16, 40)]
    for w in works:
        w.decode_padded_ctx = int(rng.integers(16, 2000)) * w.num_seqs
    times = [0.02 + 2e-4 * w.num_tokens + 5e-6 * w.decode_padded_ctx for w in works]
    coef, err = fit_linear(works, times, ("c0", "c_tok", "c_dec_ctx", "c_seq"), relative=False)
    assert coef["c0"] == pytest.approx(0.02, rel=1e-6) and coef["c_seq"] == pytest.approx(
        0, abs=1e-9
    )
    assert abs(err["total_time_error"]) < 1e-9
