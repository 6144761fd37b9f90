"""The bf16-in/bf16-out CPU kernels (kernels/csrc/cpu_bf16_dot.cpp): the vdpbf16ps projection
against an fp64 matmul on the same bf16 inputs, the bf16 RMSNorm and rope + KV-cache write
bitwise against the torch formulas they replace, and the engine's bf16 path ("bf16-dp" and
the C++ row ops) against the same model with torch's bf16 ops."""

from __future__ import annotations

import pytest
import torch
from cbbench.kernels import cpu_bf16_dot, get_attention_backend
from cbbench.reference_engine.execution import cpu_linear
from cbbench.reference_engine.execution.cpu_linear import DotLinear, optimize_cpu_linears
from cbbench.reference_engine.execution.model_runner import ModelRunner
from cbbench.reference_engine.model.llama import RMSNorm
from cbbench.reference_engine.model.rope import RotaryEmbedding

needs_kernel = pytest.mark.skipif(
    cpu_bf16_dot.load() is None, reason=f"bf16 dot kernel: {cpu_bf16_dot.unavailable_reason()}"
)
needs_fast = pytest.mark.skipif(
    cpu_bf16_dot.isa() != "avx512bf16", reason="the CPU or compiler lacks AVX512-BF16"
)


@needs_kernel
@pytest.mark.parametrize(("rows", "n_out", "k_in"), [(1, 1, 2), (3, 37, 513), (8, 96, 512),
                                                     (9, 100, 64), (20, 48, 7)])  # fmt: skip
@pytest.mark.parametrize("with_bias", [False, True])
def test_projection_equals_an_fp64_matmul_rounded_to_bf16(rows, n_out, k_in, with_bias):
    gen = torch.Generator().manual_seed(rows * 7 + n_out + k_in)
    w = torch.randn(n_out, k_in, generator=gen).to(torch.bfloat16)
    x = torch.randn(rows, k_in, generator=gen).to(torch.bfloat16)
    b = torch.randn(n_out, generator=gen) if with_bias else None
    panels = cpu_bf16_dot.pack(w)
    assert panels.shape == (-(-n_out // 16), -(-k_in // 2), 16, 2)
    assert torch.equal(cpu_bf16_dot.unpack(panels, n_out, k_in), w)
    got = cpu_bf16_dot.linear(x, panels, b, n_out)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n_out)
    want = x.double() @ w.double().T + (0 if b is None else b.double())
    # fp32 sums rounded once to bf16: within one bf16 step (2^-8 relative) of the exact sum
    err = (got.double() - want).abs()
    assert bool((err <= want.abs() * 2**-8 + 1e-3 * float(want.abs().max())).all())


@needs_kernel
def test_rms_norm_is_bitwise_the_half_type_formula():
    gen = torch.Generator().manual_seed(3)
    for rows, hidden in ((1, 16), (8, 512), (5, 100)):
        x = (torch.randn(rows, hidden, generator=gen) * 3).to(torch.bfloat16)
        norm = RMSNorm(hidden, 1e-5).to(torch.bfloat16)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(hidden, generator=gen))
        want = norm(x)  # cpu_kernel off: the torch formula
        got = cpu_bf16_dot.rms_norm(x, norm.weight.detach(), 1e-5)
        assert torch.equal(got, want)
        norm.cpu_kernel = True
        assert torch.equal(norm(x), want)


@needs_kernel
def test_rope_and_cache_is_bitwise_the_torch_path():
    gen = torch.Generator().manual_seed(1)
    t, hq, hkv, d = 5, 8, 2, 64
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=gen).to(torch.bfloat16)
    positions = torch.tensor([0, 3, 100, 7, 2000])
    cos, sin = RotaryEmbedding(d, 10000.0, 4096, None, "cpu").cos_sin(positions, 2000)
    caches = [torch.zeros(4, 4, hkv, d, dtype=torch.bfloat16) for _ in range(4)]
    slots = torch.tensor([0, 5, -1, 9, 15])
    q = cpu_bf16_dot.rope_and_cache(qkv, cos, sin, caches[0], caches[1], slots, hq, hkv, d)
    qk = qkv[:, : (hq + hkv) * d].view(t, -1, d)
    q2, k2 = RotaryEmbedding.apply(qk, cos, sin).split([hq, hkv], 1)
    v2 = qkv[:, (hq + hkv) * d :].reshape(t, hkv, d)
    get_attention_backend("torch", "cpu").reshape_and_cache(
        k2.contiguous(), v2, caches[2], caches[3], slots
    )
    assert torch.equal(q, q2)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert caches[0][2, 1].abs().sum() > 0 and caches[0][0, 1].abs().sum() == 0  # slot 9; -1


def _greedy(runner: ModelRunner, prompt: list[int], n: int) -> list[int]:
    from cbbench.reference_engine.core.executor import ScheduledChunk
    from cbbench.reference_engine.core.outputs import RequestMetrics
    from cbbench.reference_engine.core.sequence import Sequence
    from cbbench.reference_engine.sampling_params import SamplingParams

    seq = Sequence("0", list(prompt), SamplingParams(temperature=0.0, max_tokens=n),
                   RequestMetrics(0.0))  # fmt: skip
    seq.block_table = list(range(8))
    out: list[int] = []
    chunk = ScheduledChunk(seq, len(prompt))
    for _ in range(n):
        token = runner.execute([chunk])[0][0]
        seq.num_computed_tokens += chunk.num_tokens
        seq.token_ids.append(token)
        out.append(token)
        chunk = ScheduledChunk(seq, 1)
    return out


@needs_fast
def test_bf16_engine_uses_the_kernels_and_keeps_the_logprobs(monkeypatch):
    """`tiny` in bf16: "bf16-dp" and the C++ norms/rope by default; its greedy tokens match the
    same model with oneDNN linears and torch's row ops for most of 12 steps (bf16: the two
    round their sums differently)."""
    monkeypatch.delenv("CBBENCH_CPU_LINEAR", raising=False)
    fast = ModelRunner("tiny", dtype="bfloat16", num_kv_blocks=8, block_size=4, seed=4)
    assert fast.linear_impl == "bf16-dp" and isinstance(fast.model.lm_head, DotLinear)
    assert all(m.cpu_kernel for m in fast.model.modules() if isinstance(m, RMSNorm))
    monkeypatch.setattr(cpu_bf16_dot, "fast", lambda: False)
    monkeypatch.setattr(cpu_linear, "_dot_unavailable", lambda linear: "off for the test")
    slow = ModelRunner("tiny", dtype="bfloat16", num_kv_blocks=8, block_size=4, seed=4)
    assert slow.linear_impl != "bf16-dp"
    assert not any(m.cpu_kernel for m in slow.model.modules() if isinstance(m, RMSNorm))
    prompt = [5, 17, 300, 42, 7, 99, 12, 250, 3]
    got = _greedy(fast, prompt, 12)
    want = _greedy(slow, prompt, 12)
    assert got[:4] == want[:4] and sum(a == b for a, b in zip(got, want, strict=True)) >= 9, (got, want)


@needs_fast
def test_forcing_bf16_dp_on_fp32_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("CBBENCH_CPU_LINEAR", "bf16-dp")
    lin = torch.nn.Linear(32, 32)
    with pytest.raises(ValueError, match="'bf16-dp' is unavailable here: dtype torch.float32"):
        optimize_cpu_linears(torch.nn.Sequential(lin))


@needs_kernel
@pytest.mark.parametrize(("rows", "n_out", "k_in"), [(1, 1, 2), (8, 100, 77), (9, 96, 512)])
def test_grouped_panels_give_the_same_projection(rows, n_out, k_in):
    gen = torch.Generator().manual_seed(n_out + k_in)
    w = torch.randn(n_out, k_in, generator=gen).to(torch.bfloat16)
    x = torch.randn(rows, k_in, generator=gen).to(torch.bfloat16)
    grouped = cpu_bf16_dot.pack_grouped(w)
    assert grouped.shape == (-(-n_out // 48), -(-k_in // 2), 3, 16, 2)
    assert torch.equal(cpu_bf16_dot.unpack(grouped, n_out, k_in), w)
    want = cpu_bf16_dot.linear(x, cpu_bf16_dot.pack(w), None, n_out)
    assert torch.equal(cpu_bf16_dot.linear(x, grouped, None, n_out), want)
