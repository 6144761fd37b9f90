"""The bf16-weight CPU projection kernel (kernels/csrc/cpu_linear_bf16.cpp) against an fp32
matmul on the same bf16 weight, and its place among the CPU linear layouts
(reference_engine/execution/cpu_linear.py, "bf16-avx2")."""

from __future__ import annotations

import pytest
import torch
from cbbench.kernels import cpu_bf16_dot, cpu_gemm, cpu_linear_bf16
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution import cpu_linear
from cbbench.reference_engine.execution.cpu_linear import Bf16Linear, optimize_cpu_linears
from cbbench.reference_engine.execution.model_runner import ModelRunner
from cbbench.reference_engine.model.loader import random_model
from engine_model_support import paged_logits

PROMPT = [5, 17, 300, 42, 7, 99, 12, 250, 3]

needs_kernel = pytest.mark.skipif(
    cpu_linear_bf16.load() is None, reason=f"bf16 kernel: {cpu_linear_bf16.unavailable_reason()}"
)


def oracle(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """fp64 reference on the bf16 weight (exact products, so only the kernel's fp32 sums
    differ)."""
    y = x.double() @ w.double().T
    return (y if b is None else y + b.double()).float()


@needs_kernel
@pytest.mark.parametrize("k_in", [16, 72, 512, 513])
@pytest.mark.parametrize("n_out", [1, 31, 96])
@pytest.mark.parametrize("with_bias", [False, True])
def test_kernel_equals_an_fp32_matmul_on_the_bf16_weight(k_in, n_out, with_bias):
    gen = torch.Generator().manual_seed(n_out * 1000 + k_in)
    w = torch.randn(n_out, k_in, generator=gen).to(torch.bfloat16)
    b = torch.randn(n_out, generator=gen) if with_bias else None
    panels = cpu_linear_bf16.pack(w)
    assert panels.shape == (-(-n_out // 8), k_in, 8) and panels.dtype == torch.bfloat16
    torch.testing.assert_close(cpu_linear_bf16.unpack(panels, n_out), w.float(), rtol=0, atol=0)
    for rows in (1, 3, 8, 33, 130):
        x = torch.randn(rows, k_in, generator=gen)
        want = oracle(x, w, b)
        got = cpu_linear_bf16.linear(x, panels, b, n_out)
        assert got.shape == want.shape and got.dtype == torch.float32
        # relative to the output's scale: fp32 sums of k_in terms
        err = float((got - want).abs().max()) / float(want.abs().max())
        assert err < 1e-5, (rows, k_in, n_out, err)
        # and the torch bf16 reference in fp32: x.float() @ w.float().T
        ref = x @ w.float().T + (0 if b is None else b)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


@needs_kernel
def test_the_kernel_itself_handles_every_row_count_and_threads():
    """The C++ entry point directly: row counts around its 4-row tile, 1 and 2 threads."""
    mod = cpu_linear_bf16.load()
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(53, 40, generator=gen).to(torch.bfloat16)
    b = torch.randn(53, generator=gen)
    panels = cpu_linear_bf16.pack(w)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for rows in (1, 2, 3, 4, 5, 7, 64, 70):
                x = torch.randn(rows, 40, generator=gen)
                got = mod.linear_bf16(x, panels, b, 53)
                want = oracle(x, w, b)
                assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())
    finally:
        torch.set_num_threads(before)
    assert mod.linear_bf16(torch.randn(0, 40), panels, None, 53).shape == (0, 53)
    with pytest.raises(RuntimeError, match="x has K=39"):
        mod.linear_bf16(torch.randn(3, 39), panels, None, 53)
    with pytest.raises(RuntimeError, match="N=60 needs 8 panels, got 7"):
        mod.linear_bf16(torch.randn(3, 40), panels, None, 60)


@needs_kernel
def test_bf16_linear_module_takes_bf16_rows_and_returns_bf16():
    lin = torch.nn.Linear(48, 80).to(torch.bfloat16)
    fast = Bf16Linear(lin)
    x = torch.randn(2, 5, 96, dtype=torch.bfloat16)[..., ::2]  # not contiguous
    with torch.inference_mode():
        got = fast(x)
        assert got.dtype == torch.bfloat16 and got.shape == (2, 5, 80)
        want = oracle(x.reshape(-1, 48).float(), lin.weight.float(), lin.bias.float())
        # the only difference: the output's rounding to bf16 (8 bits of mantissa)
        torch.testing.assert_close(got.float().reshape(-1, 80), want, rtol=2**-8, atol=1e-6)


@needs_kernel
def test_bf16_models_choose_the_kernel_and_keep_the_logprobs(monkeypatch):
    """`tiny` in bf16 on a CPU without oneDNN's bf16 path (AVX2-only ones; on others its
    self-check is made to fail here) picks "bf16-avx2"; its first-token logprobs match the same
    bf16 model with torch's column-major bf16 linears. Not bit-equal: torch rounds each bf16
    matmul's sums differently from our fp32 sums (both round the output to bf16), so compare
    log-softmax closely instead of tokens."""
    if cpu_linear._onednn_ok(torch.nn.Linear(64, 64).to(torch.bfloat16)):
        monkeypatch.setattr(cpu_linear, "_onednn_ok", lambda linear: False)
    monkeypatch.setattr(cpu_linear, "_dot_unavailable", lambda linear: "off for the test")
    monkeypatch.delenv("CBBENCH_CPU_LINEAR", raising=False)
    fast = random_model("tiny", "bfloat16", seed=4)
    assert optimize_cpu_linears(fast) == "bf16-avx2"
    assert isinstance(fast.lm_head, Bf16Linear)
    slow = random_model("tiny", "bfloat16", seed=4)
    assert optimize_cpu_linears(slow, "column-major") == "column-major"
    got = torch.log_softmax(paged_logits(fast, PROMPT).float(), -1)
    want = torch.log_softmax(paged_logits(slow, PROMPT).float(), -1)
    # tiny's logprobs sit near -log(512) = -6.2; bf16 resolves 2^-8 relative (~0.024 there)
    assert float((got - want).abs().max()) < 0.05
    assert not torch.equal(got, torch.log_softmax(paged_logits(random_model("tiny", seed=4),
                                                                PROMPT), -1))  # fmt: skip
    runner = ModelRunner("tiny", dtype="bfloat16", num_kv_blocks=8, block_size=4)
    assert runner.linear_impl == "bf16-avx2"
    monkeypatch.setenv("CBBENCH_CPU_LINEAR", "bf16-avx2")
    assert ModelRunner("tiny", dtype="bfloat16", num_kv_blocks=8, block_size=4).linear_impl == (
        "bf16-avx2"
    )


def test_bad_bf16_choices_are_one_line_errors(monkeypatch):
    monkeypatch.setenv("CBBENCH_CPU_LINEAR", "bf16")
    with pytest.raises(EngineError, match=r"CPU linear 'bf16': choose one of .*bf16-avx2") as e:
        ModelRunner("tiny", dtype="bfloat16", num_kv_blocks=8, block_size=4)
    assert "\n" not in str(e.value)
    monkeypatch.setenv("CBBENCH_CPU_LINEAR", "bf16-avx2")
    with pytest.raises(EngineError, match="'bf16-avx2' is unavailable here: dtype torch.float32"):
        ModelRunner("tiny", num_kv_blocks=8, block_size=4)


def test_without_the_kernel_bf16_falls_back_to_column_major(monkeypatch):
    """A machine where the kernel cannot build keeps torch's bf16 matmul; forcing it says why."""
    monkeypatch.delenv("CBBENCH_CPU_LINEAR", raising=False)
    monkeypatch.setattr(cpu_linear_bf16, "_state", {"reason": "no C++ compiler ('c++')"})
    monkeypatch.setattr(cpu_bf16_dot, "_state", {"reason": "no C++ compiler ('c++')"})
    monkeypatch.setattr(cpu_linear, "_onednn_ok", lambda linear: False)
    assert optimize_cpu_linears(random_model("tiny", "bfloat16", seed=4)) == "column-major"
    monkeypatch.setenv("CBBENCH_CPU_LINEAR", "bf16-avx2")
    with pytest.raises(EngineError, match=r"'bf16-avx2' is unavailable here: no C\+\+ compiler"):
        ModelRunner("tiny", dtype="bfloat16", num_kv_blocks=8, block_size=4)


@pytest.mark.slow
def test_the_scalar_fallback_builds_and_matches_the_oracle():
    """The same source compiled without AVX2/FMA (a CPU the intrinsics do not target): the
    plain loops give the same answers (builds a second module, about a minute)."""
    mod = cpu_gemm._build(extra_cflags=["-mno-avx2", "-mno-fma"],
                          name="cbbench_cpu_bf16_kernels_scalar",
                          sources=cpu_linear_bf16.SOURCES)  # fmt: skip
    assert mod.isa() == "scalar"
    gen = torch.Generator().manual_seed(9)
    for rows, k_in, n_out in ((1, 513, 31), (7, 72, 96), (33, 16, 1)):
        w = torch.randn(n_out, k_in, generator=gen).to(torch.bfloat16)
        b = torch.randn(n_out, generator=gen)
        x = torch.randn(rows, k_in, generator=gen)
        got = mod.linear_bf16(x, cpu_linear_bf16.pack(w), b, n_out)
        want = oracle(x, w, b)
        assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())


@pytest.mark.slow
@pytest.mark.skipif("avx2" not in cpu_gemm._cpu_flags(), reason="the CPU lacks AVX2")
def test_the_avx2_build_matches_the_oracle_on_an_avx512_machine_too():
    """The AVX2 path compiled on purpose (-mno-avx512f), so an AVX-512 machine checks the
    code an AVX2-only one runs (and vice versa the default build): bf16 and int8 weights,
    tails of N and rows (builds a second module, about a minute)."""
    mod = cpu_gemm._build(extra_cflags=["-mno-avx512f"], name="cbbench_cpu_bf16_kernels_avx2",
                          sources=cpu_linear_bf16.SOURCES)  # fmt: skip
    assert mod.isa() == "avx2"
    gen = torch.Generator().manual_seed(10)
    for rows, k_in, n_out in ((1, 513, 31), (7, 72, 96), (33, 16, 1), (9, 64, 200)):
        w = torch.randn(n_out, k_in, generator=gen)
        b = torch.randn(n_out, generator=gen)
        x = torch.randn(rows, k_in, generator=gen)
        wb = w.to(torch.bfloat16)
        got = mod.linear_bf16(x, cpu_linear_bf16.pack(wb), b, n_out)
        want = oracle(x, wb, b)
        assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())
        panels, scales = cpu_linear_bf16.pack_int8(w)
        got = mod.linear_int8(x, panels, scales, b, n_out)
        want = oracle(x, cpu_linear_bf16.unpack_int8(panels, scales), b)
        assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())
