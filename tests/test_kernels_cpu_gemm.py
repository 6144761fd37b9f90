"""The "panels" CPU projection kernel (kernels/csrc/cpu_gemm.cpp) against F.linear, and its
place among the CPU linear layouts (reference_engine/execution/cpu_linear.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cbbench.kernels import cpu_gemm
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.cpu_linear import PanelLinear, optimize_cpu_linears
from cbbench.reference_engine.execution.model_runner import ModelRunner
from cbbench.reference_engine.model.loader import random_model
from engine_model_support import paged_logits

PROMPT = [5, 17, 300, 42, 7, 99, 12, 250, 3]

needs_panels = pytest.mark.skipif(
    cpu_gemm.load() is None, reason=f"panels kernel: {cpu_gemm.unavailable_reason()}"
)


@needs_panels
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n_out, k_in", [(64, 32), (100, 70), (33, 512), (31, 17), (1, 5)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_panels_equal_f_linear(threads, n_out, k_in, with_bias):
    gen = torch.Generator().manual_seed(n_out * 1000 + k_in)
    w = torch.randn(n_out, k_in, generator=gen)
    b = torch.randn(n_out, generator=gen) if with_bias else None
    panels, bias = cpu_gemm.pack(w, b)
    assert panels.shape == (-(-n_out // 32), k_in, 32)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows in (1, 3, 8, 9, 17, 130):
            x = torch.randn(rows, k_in, generator=gen)
            want = F.linear(x, w, b)
            got = cpu_gemm.linear(x, panels, bias, n_out)
            assert got.shape == want.shape
            scale = float(want.abs().max())
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * scale * k_in**0.5)
    finally:
        torch.set_num_threads(before)


@needs_panels
@pytest.mark.parametrize("n_out", [64, 45, 7])
def test_residual_is_added_after_the_sum_bitwise(n_out):
    gen = torch.Generator().manual_seed(n_out)
    w, b = torch.randn(n_out, 40, generator=gen), torch.randn(n_out, generator=gen)
    panels, bias = cpu_gemm.pack(w, b)
    mod = cpu_gemm.load()
    for rows in (1, 8, 13, 300):
        x, r = torch.randn(rows, 40, generator=gen), torch.randn(rows, n_out, generator=gen)
        got = mod.linear(x, panels, bias, n_out, r)
        assert torch.equal(got, mod.linear(x, panels, bias, n_out).add_(r))
        assert torch.equal(got, r + mod.linear(x, panels, bias, n_out))  # either order
    with pytest.raises(RuntimeError, match="residual must be contiguous fp32"):
        mod.linear(x, panels, bias, n_out, torch.randn(rows, n_out + 1))


@needs_panels
def test_panel_linear_takes_any_leading_dims_and_strided_rows():
    lin = torch.nn.Linear(48, 80)
    fast = PanelLinear(lin)
    x = torch.randn(2, 5, 96)[..., ::2]  # not contiguous
    with torch.inference_mode():
        torch.testing.assert_close(fast(x), lin(x), rtol=1e-4, atol=1e-5)
        assert fast(torch.randn(0, 48)).shape == (0, 80)
    with pytest.raises(RuntimeError, match="x has 47 columns"):
        cpu_gemm.linear(torch.randn(3, 47), fast.panels, None, 80)


@needs_panels
def test_panels_are_the_fp32_default_and_keep_the_logits(monkeypatch):
    monkeypatch.delenv("CBBENCH_CPU_LINEAR", raising=False)
    want = paged_logits(random_model("tiny", seed=4), PROMPT)
    model = random_model("tiny", seed=4)
    assert optimize_cpu_linears(model) == "panels"
    assert isinstance(model.lm_head, PanelLinear)
    assert model.lm_head.panels.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    torch.testing.assert_close(paged_logits(model, PROMPT), want, rtol=1e-4, atol=1e-4)
    assert ModelRunner("tiny", num_kv_blocks=8, block_size=4).linear_impl == "panels"


@pytest.mark.parametrize("forced", ["onednn", "column-major"])
def test_a_forced_choice_is_used(monkeypatch, forced):
    monkeypatch.setenv("CBBENCH_CPU_LINEAR", forced)
    want = paged_logits(random_model("tiny", seed=4), PROMPT)
    model = random_model("tiny", seed=4)
    assert optimize_cpu_linears(model) == forced
    torch.testing.assert_close(paged_logits(model, PROMPT), want, rtol=1e-4, atol=1e-4)
    assert ModelRunner("tiny", num_kv_blocks=8, block_size=4).linear_impl == forced


def test_without_the_kernel_fp32_falls_back_to_onednn(monkeypatch):
    """A machine where the kernel cannot build (no AVX-512, no compiler) keeps oneDNN."""
    monkeypatch.delenv("CBBENCH_CPU_LINEAR", raising=False)
    monkeypatch.setattr(cpu_gemm, "_state", {"reason": "the CPU lacks AVX-512F"})
    assert cpu_gemm.load() is None
    model = random_model("tiny", seed=4)
    assert optimize_cpu_linears(model) == "onednn"
    monkeypatch.setenv("CBBENCH_CPU_LINEAR", "panels")
    with pytest.raises(EngineError, match="'panels' is unavailable here: the CPU lacks AVX-512F"):
        ModelRunner("tiny", num_kv_blocks=8, block_size=4)


def test_bad_choices_are_refused(monkeypatch):
    monkeypatch.setenv("CBBENCH_CPU_LINEAR", "mkl")
    with pytest.raises(EngineError, match="choose one of auto, panels, onednn, column-major"):
        ModelRunner("tiny", num_kv_blocks=8, block_size=4)
    monkeypatch.setenv("CBBENCH_CPU_LINEAR", "panels")
    with pytest.raises(EngineError, match="'panels' is unavailable here"):
        ModelRunner("tiny", dtype="bfloat16", num_kv_blocks=8, block_size=4)
