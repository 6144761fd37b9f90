"""The C++ row ops (kernels/csrc/cpu_ops.cpp) against torch, and where the engine uses them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cbbench.kernels import cpu_gemm, cpu_ops
from cbbench.reference_engine.execution.model_runner import ModelRunner
from cbbench.reference_engine.execution.sampler import Sampler, SampleRequest
from cbbench.reference_engine.model.llama import RMSNorm
from cbbench.reference_engine.sampling_params import SamplingParams

pytestmark = pytest.mark.skipif(
    not cpu_ops.available(), reason=f"CPU kernels: {cpu_gemm.unavailable_reason()}"
)


@pytest.mark.parametrize("rows, hidden", [(1, 512), (8, 512), (37, 896), (3, 40), (2, 7)])
def test_rms_norm_equals_f_rms_norm(rows, hidden):
    gen = torch.Generator().manual_seed(rows * hidden)
    x = torch.randn(rows, hidden, generator=gen) * 3
    w = torch.randn(hidden, generator=gen)
    got = cpu_ops.rms_norm(x, w, 1e-6)
    torch.testing.assert_close(got, F.rms_norm(x, (hidden,), w, 1e-6), rtol=2e-6, atol=2e-6)
    assert got.shape == x.shape


def test_rms_norm_keeps_leading_shape_and_reads_strided_input():
    x = torch.randn(4, 3, 64).transpose(0, 1)  # not contiguous
    w = torch.rand(64)
    torch.testing.assert_close(cpu_ops.rms_norm(x, w, 1e-5), F.rms_norm(x, (64,), w, 1e-5))


@pytest.mark.parametrize("vocab", [1, 15, 16, 17, 32000, 151936])
def test_argmax_equals_torch_with_ties_nan_and_inf(vocab):
    gen = torch.Generator().manual_seed(vocab)
    x = torch.randn(6, vocab, generator=gen)
    if vocab > 3:
        x[1, [2, vocab - 1]] = 50.0  # a tie: the first index wins
        x[2, vocab // 2] = float("nan")  # NaN wins wherever it is
        x[2, vocab - 1] = float("nan")
        x[3, vocab - 1] = float("inf")
    x[4] = float("-inf")  # all -inf: index 0
    x[5, -1] = float("nan")  # NaN in the tail lanes
    assert torch.equal(cpu_ops.argmax_rows(x), x.argmax(dim=-1))


def test_rms_norm_module_uses_the_kernel_only_when_switched_on(monkeypatch):
    calls = []
    real = cpu_ops.rms_norm
    monkeypatch.setattr(cpu_ops, "rms_norm", lambda *a: calls.append(1) or real(*a))
    norm = RMSNorm(32, 1e-5)
    x = torch.randn(3, 32)
    want = norm(x)
    assert not calls
    norm.cpu_kernel = True
    torch.testing.assert_close(norm(x), want)
    norm(x.to(torch.bfloat16))  # other dtypes keep the torch formula
    assert calls == [1]


def test_model_runner_switches_norms_on_and_sampler_argmax_agrees():
    runner = ModelRunner("tiny", num_kv_blocks=8, block_size=4)
    norms = [m for m in runner.model.modules() if isinstance(m, RMSNorm)]
    assert norms and all(m.cpu_kernel for m in norms)
    s = Sampler((2,), torch.device("cpu"))
    logits = torch.randn(5, 1000)
    reqs = [SampleRequest(SamplingParams(temperature=0.0), 3, 0) for _ in range(5)]
    assert s(logits.clone(), reqs) == logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize("hq, hkv, d", [(8, 8, 64), (4, 2, 16), (14, 2, 64), (2, 1, 10)])
def test_rope_and_cache_equals_rotate_then_reshape_and_cache(hq, hkv, d):
    from cbbench.kernels.torch_backend import TorchAttentionBackend
    from cbbench.reference_engine.model.rope import RotaryEmbedding

    gen = torch.Generator().manual_seed(hq * d)
    t, nb, bs = 7, 6, 4
    rope = RotaryEmbedding(d, 10000.0, 64, None, "cpu")
    positions = torch.tensor([0, 3, 9, 17, 18, 40, 63])
    cos, sin = rope.cos_sin(positions, 63)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=gen)
    slots = torch.tensor([3, 0, 22, -1, 5, 23, 11])  # -1: a padded row writes nothing
    kc, vc = torch.zeros(nb, bs, hkv, d), torch.zeros(nb, bs, hkv, d)
    q = cpu_ops.rope_and_cache(qkv, cos, sin, kc, vc, slots, hq, hkv, d)

    qk = qkv[:, : (hq + hkv) * d].view(t, -1, d)
    rq, rk = RotaryEmbedding.apply(qk, cos, sin).split([hq, hkv], 1)
    rv = qkv[:, (hq + hkv) * d :].reshape(t, hkv, d)
    rkc, rvc = torch.zeros_like(kc), torch.zeros_like(vc)
    TorchAttentionBackend(torch.device("cpu")).reshape_and_cache(
        rk.contiguous(), rv, rkc, rvc, slots
    )
    torch.testing.assert_close(q, rq, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(kc, rkc, rtol=1e-6, atol=1e-6)
    assert torch.equal(vc, rvc)
    assert int((kc != 0).any(dim=(2, 3)).sum()) == 6  # six slots written, the padded row none


def test_rope_and_cache_rejects_a_slot_past_the_cache():
    qkv, cos, sin = torch.randn(2, 3 * 8), torch.randn(2, 4), torch.randn(2, 4)
    kc, vc = torch.zeros(2, 2, 1, 8), torch.zeros(2, 2, 1, 8)
    with pytest.raises(RuntimeError, match="outside the cache"):
        cpu_ops.rope_and_cache(qkv, cos, sin, kc, vc, torch.tensor([1, 4]), 1, 1, 8)


@pytest.mark.parametrize("inter", [2048, 1408, 37, 5, 16])
def test_silu_mul_is_torchs_within_a_few_ulp(inter):
    gen = torch.Generator().manual_seed(inter)
    gu = torch.randn(40, 2 * inter, generator=gen) * 6
    edges = [float("nan"), float("inf"), -float("inf"), 100.0, -100.0, -88.0, 88.0, 0.0, -0.0]
    gu[0, : min(inter, len(edges))] = torch.tensor(edges[: min(inter, len(edges))])
    want = F.silu(gu[:, :inter]) * gu[:, inter:]
    got = cpu_ops.silu_mul(gu, inter)
    assert torch.equal(got.isnan(), want.isnan())
    torch.testing.assert_close(got.nan_to_num(), want.nan_to_num(), rtol=5e-7, atol=0)
    three_d = cpu_ops.silu_mul(gu.view(4, 10, 2 * inter), inter)  # leading dims kept
    assert torch.equal(three_d.view(40, inter).nan_to_num(), got.nan_to_num())
    with pytest.raises(RuntimeError, match="silu_mul"):
        cpu_gemm.load().silu_mul(gu[:, 1:].contiguous(), inter)
