"""The C++ paged decode attention (kernels/csrc/cpu_attention.cpp) against the oracle in
kernels/reference.py, and its place in the torch backend (fp32 decode on the CPU)."""

from __future__ import annotations

import pytest
import torch
from cbbench.kernels import cpu_attention, cpu_gemm
from cbbench.kernels.reference import make_paged_case, ref_paged_decode_attention
from cbbench.kernels.torch_backend import TorchAttentionBackend

pytestmark = pytest.mark.skipif(
    not cpu_attention.available(), reason=f"CPU kernels: {cpu_gemm.unavailable_reason()}"
)


def case(seq_lens, block_size, num_kv_heads, group, head_dim=64, seed=0):
    c = make_paged_case(seq_lens, [1] * len(seq_lens), block_size, num_kv_heads, group,
                        head_dim=head_dim, seed=seed)  # fmt: skip
    return c["q"], c["k_cache"], c["v_cache"], c["block_tables"], c["seq_lens"]


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    saved = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(saved)


@pytest.mark.parametrize(
    "seq_lens,block_size,num_kv_heads,group,head_dim",
    [
        ([1, 17, 100, 65], 16, 2, 4, 64),  # one token, off the block size, GQA
        ([129, 64, 33], 16, 8, 1, 64),  # no GQA, exact blocks
        ([40, 41], 1, 2, 8, 16),  # block size 1, wide groups
        ([300, 5, 260], 64, 4, 2, 24),  # head_dim off 16: masked tail lanes
        ([77], 16, 8, 1, 80),  # one sequence: its heads split between threads
        ([700, 1100], 32, 1, 8, 128),  # long contexts, one KV head (MQA)
    ],
)
def test_decode_matches_oracle(threads, seq_lens, block_size, num_kv_heads, group, head_dim):
    q, kc, vc, bt, sl = case(seq_lens, block_size, num_kv_heads, group, head_dim, seed=threads)
    out = cpu_attention.paged_decode_attention(q, kc, vc, bt, sl, scale=head_dim**-0.5)
    assert out.shape == q.shape and out.dtype == torch.float32
    ref = ref_paged_decode_attention(q, kc, vc, bt, sl, scale=head_dim**-0.5)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


def test_reads_each_sequence_through_its_own_table():
    """A block only sequence 1 uses changes sequence 1's output and no other's; a pool block
    no table names changes nothing (no gather of the wrong rows, no read past the length)."""
    q, kc, vc, bt, sl = case([20, 30, 9], 4, 2, 2)
    before = cpu_attention.paged_decode_attention(q, kc, vc, bt, sl, scale=0.25)
    vc[bt[1, 2]] += 1.0
    after = cpu_attention.paged_decode_attention(q, kc, vc, bt, sl, scale=0.25)
    torch.testing.assert_close(after[[0, 2]], before[[0, 2]], atol=0, rtol=0)
    assert not torch.allclose(after[1], before[1])
    used = {int(b) for row, n in zip(bt, sl.tolist(), strict=True) for b in row[: -(-n // 4)]}
    unused = next(b for b in range(kc.shape[0]) if b not in used)
    kc[unused] = float("nan")
    vc[bt[2, 2], 1:] = float("nan")  # sequence 2 has 9 tokens: only slot 0 of block 2 is read
    again = cpu_attention.paged_decode_attention(q, kc, vc, bt, sl, scale=0.25)
    torch.testing.assert_close(again, after, atol=0, rtol=0)


def test_bad_block_id_is_one_clear_error():
    q, kc, vc, bt, sl = case([20, 30], 4, 2, 2)
    bt[1, 3] = kc.shape[0]  # past the pool
    with pytest.raises(RuntimeError, match="outside the pool"):
        cpu_attention.paged_decode_attention(q, kc, vc, bt, sl, scale=0.25)
    sl[0] = bt.shape[1] * 4 + 1
    with pytest.raises(RuntimeError, match="has length"):
        cpu_attention.paged_decode_attention(q, kc, vc, bt, sl, scale=0.25)


@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16], ids=["fp32-q", "bf16-q"])
def test_bf16_cache_matches_the_oracle_on_the_same_bf16_values(threads, q_dtype):
    """bf16 rows widened in registers are exactly the fp32 oracle's inputs, so only the
    summation order differs (fp32 query), plus the output's rounding to bf16 (bf16 query:
    8 significant bits, 2^-8 relative)."""
    q, kc, vc, bt, sl = case([1, 17, 300, 65], 16, 2, 4, head_dim=72, seed=threads)  # tail lanes
    q, kc, vc = q.to(q_dtype), kc.bfloat16(), vc.bfloat16()
    out = cpu_attention.paged_decode_attention(q, kc, vc, bt, sl, scale=72**-0.5)
    assert out.shape == q.shape and out.dtype == q_dtype
    ref = ref_paged_decode_attention(q.float(), kc.float(), vc.float(), bt, sl, scale=72**-0.5)
    tol = 2e-5 if q_dtype == torch.float32 else 8e-3
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


def test_backend_runs_it_for_fp32_and_bf16_decode(monkeypatch):
    calls = []
    real = cpu_attention.paged_decode_attention
    monkeypatch.setattr(
        cpu_attention,
        "paged_decode_attention",
        lambda *a: calls.append((a[0].dtype, a[1].dtype)) or real(*a),
    )
    be = TorchAttentionBackend(torch.device("cpu"))
    assert be.paged_kernel and be.decode_kernels()["decode_kernel_bf16"] == "cpp"
    cases = [(torch.float32,) * 2, (torch.bfloat16,) * 2, (torch.float32, torch.bfloat16)]
    for q_dtype, cache_dtype in cases:  # the last: --kv-cache-dtype bf16 under an fp32 model
        q, kc, vc, bt, sl = case([20, 33], 16, 2, 2)
        q, kc, vc = q.to(q_dtype), kc.to(cache_dtype), vc.to(cache_dtype)
        out = be.paged_decode_attention(q, kc, vc, bt, sl, scale=0.25)
        assert out.dtype == q_dtype
        ref = ref_paged_decode_attention(q.float(), kc.float(), vc.float(), bt, sl, scale=0.25)
        tol = 8e-3 if q_dtype == torch.bfloat16 else 2e-5
        torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
    assert calls == cases
    q, kc, vc, bt, sl = case([20, 33], 16, 2, 2)
    int8 = torch.zeros(*kc.shape[:3], kc.shape[3] + 1, dtype=torch.int8)
    assert not cpu_attention.supports(q, int8)  # quantized caches: cpu_kv_attention's
