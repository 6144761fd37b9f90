"""The fused CPU decoder layer (reference_engine/model/cpu_fused.py) against the module path
it bypasses, bitwise, fp32 and bf16, prefill and decode; and its two new bf16 kernels (silu *
up in one pass, the residual add inside the projection) against the torch ops they replace."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cbbench.kernels import cpu_bf16_dot, cpu_gemm
from cbbench.reference_engine.core.executor import ScheduledChunk
from cbbench.reference_engine.core.outputs import RequestMetrics
from cbbench.reference_engine.core.sequence import Sequence
from cbbench.reference_engine.execution.model_runner import ModelRunner, prepare_batch
from cbbench.reference_engine.sampling_params import SamplingParams

needs_fast = pytest.mark.skipif(
    cpu_bf16_dot.isa() != "avx512bf16", reason="the CPU or compiler lacks AVX512-BF16"
)


@needs_fast
def test_silu_mul_is_torch_silu_times_up_in_bf16():
    gen = torch.Generator().manual_seed(0)
    for rows, inter, scale in [(8, 2048, 1.0), (3, 100, 30.0), (1, 16, 4.0)]:
        gu = (torch.randn(rows, 2 * inter, generator=gen) * scale).to(torch.bfloat16)
        gate, up = gu.split(inter, -1)
        assert torch.equal(cpu_bf16_dot.silu_mul(gu), F.silu(gate) * up)
    edge = [-1e4, -100.0, -88.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 88.0, 100.0, float("inf"),
            float("-inf"), float("nan"), -90.0, -95.0, 1.0]  # fmt: skip
    gu = torch.tensor([edge + [1.0] * 16]).to(torch.bfloat16)
    got, want = cpu_bf16_dot.silu_mul(gu), F.silu(gu[:, :16]) * gu[:, 16:]
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())


@needs_fast
@pytest.mark.parametrize(("rows", "n_out", "k_in"), [(1, 37, 513), (8, 512, 512), (9, 45, 77)])
def test_projection_with_residual_is_the_bf16_add(rows, n_out, k_in):
    gen = torch.Generator().manual_seed(rows + n_out)
    w = torch.randn(n_out, k_in, generator=gen).to(torch.bfloat16)
    x = torch.randn(rows, k_in, generator=gen)  # fp32 in: rounded to bf16 first
    r = torch.randn(rows, n_out, generator=gen).to(torch.bfloat16)
    panels = cpu_bf16_dot.pack(w)
    plain = cpu_bf16_dot.linear(x.to(torch.bfloat16), panels, None, n_out)
    assert torch.equal(cpu_bf16_dot.linear(x, panels, None, n_out, residual=r), r + plain)


def _runner_and_chunks(dtype: str) -> tuple[ModelRunner, list[ScheduledChunk]]:
    runner = ModelRunner("tiny", num_kv_blocks=32, block_size=8, dtype=dtype, num_threads=1)
    chunks = []
    for i, n in enumerate((19, 3, 11)):
        prompt = [(11 * i + j) % 200 + 1 for j in range(n)]
        seq = Sequence(str(i), prompt, SamplingParams(temperature=0.0), RequestMetrics(0.0))
        seq.block_table = list(range(i * 4, (i + 1) * 4))
        chunks.append(ScheduledChunk(seq, n))
    return runner, chunks


def _forward(runner: ModelRunner, chunks, mode: str | None):
    for layer in runner.model.model.layers:
        layer.cpu_fused = mode
    b = prepare_batch(chunks, runner.block_size, runner.model_config.vocab_size, runner.device)
    kv = runner.kv_cache.clone()
    with torch.inference_mode():
        hidden = runner.model(b.input_ids, b.positions, b.max_position, kv, b.meta, runner.backend)
    return hidden, kv


@pytest.mark.skipif(cpu_gemm.load() is None, reason="the CPU kernels are not built here")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_layer_is_bitwise_the_module_path(dtype):
    runner, chunks = _runner_and_chunks(dtype)
    mode = runner.model.model.layers[0].cpu_fused
    if dtype == "bfloat16" and not cpu_bf16_dot.fast():
        assert mode is None  # no vdpbf16ps: the module path (oneDNN) stays
        return
    assert mode == dtype, f"the ModelRunner did not turn the fused layer on ({runner.linear_impl})"
    for step in ("prefill", "decode"):
        want_h, want_kv = _forward(runner, chunks, None)
        got_h, got_kv = _forward(runner, chunks, mode)
        assert torch.equal(got_h, want_h), step
        assert torch.equal(got_kv, want_kv), step
        runner.kv_cache.copy_(want_kv)  # the prompts cached: one decode token each next
        for c in chunks:
            c.seq.num_computed_tokens = c.seq.num_tokens - 1
        chunks = [ScheduledChunk(c.seq, 1) for c in chunks]


@pytest.mark.parametrize("value", ["0", "off"])  # the CBBENCH_* switches read one way
def test_fused_layer_can_be_turned_off(monkeypatch, value):
    monkeypatch.setenv("CBBENCH_CPU_FUSED", value)
    runner, _ = _runner_and_chunks("float32")
    assert all(layer.cpu_fused is None for layer in runner.model.model.layers)


@pytest.mark.skipif(cpu_gemm.load() is None, reason="the CPU kernels are not built here")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_layer_plans_follow_replaced_weights_after_forget(dtype):
    """The stack reads its weights from plans cached at the first step; `forget` (called by
    the ModelRunner after moving weights to huge pages) makes the next step read them again."""
    from cbbench.reference_engine.model import cpu_fused

    runner, chunks = _runner_and_chunks(dtype)
    mode = runner.model.model.layers[0].cpu_fused
    if mode is None:
        pytest.skip("no fused layer here (no vdpbf16ps for bf16)")
    before, _ = _forward(runner, chunks, mode)  # plans cached
    lin = runner.model.model.layers[0].mlp.down_proj
    lin.panels = lin.panels.clone().mul_(2)  # a new tensor, as a move to huge pages would be
    stale, _ = _forward(runner, chunks, mode)
    assert torch.equal(stale, before)  # still the cached plan's tensor
    cpu_fused.forget(runner.model.model.layers)
    got, _ = _forward(runner, chunks, mode)
    want, _ = _forward(runner, chunks, None)  # the module path reads the new panels
    assert not torch.equal(got, before)
    assert torch.equal(got, want)
