"""The torch backend (the engine's CPU path) against the oracle in kernels/reference.py."""

from __future__ import annotations

import pytest
import torch
from cbbench.kernels import available_backends, get_attention_backend
from cbbench.kernels.reference import (
    make_paged_case,
    ref_paged_attention,
    ref_paged_decode_attention,
    ref_reshape_and_cache,
)
from cbbench.kernels.torch_backend import TorchAttentionBackend as _Backend

# Tolerances per dtype: fp32 accumulates like the oracle; bf16 inputs keep 8 mantissa bits.
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def TorchAttentionBackend(device: torch.device) -> _Backend:  # noqa: N802
    """The backend's torch path: the C++ decode kernel has tests of its own
    (test_kernels_cpu_attention.py)."""
    be = _Backend(device)
    be.paged_kernel = False
    return be


def make_case(seq_lens, qlens, block_size, num_kv_heads, group, **kw):
    c = make_paged_case(seq_lens, qlens, block_size, num_kv_heads, group, **kw)
    return (
        c["q"],
        c["k_cache"],
        c["v_cache"],
        c["block_tables"],
        c["seq_lens"],
        c["query_start_loc"],
    )


GRID = [
    # (seq_lens, qlens, block_size, Hkv, group)
    ([7], [7], 1, 2, 1),  # block size 1, plain prefill
    ([37, 16, 5], [37, 16, 5], 16, 1, 4),  # full prefills, lengths off the block size
    ([40, 23], [8, 23], 16, 2, 8),  # chunked prefill on a cached prefix + a full prefill
    ([70, 9, 33, 1], [1, 3, 1, 1], 32, 2, 4),  # mixed decode / chunk batch, larger blocks
    ([129, 64], [1, 1], 16, 4, 1),  # decode only
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", GRID)
def test_paged_attention_matches_oracle(case, dtype):
    seq_lens, qlens, block_size, num_kv_heads, group = case
    q, kc, vc, bt, sl, qsl = make_case(
        seq_lens, qlens, block_size, num_kv_heads, group, dtype=dtype
    )
    be = TorchAttentionBackend(torch.device("cpu"))
    out = be.paged_attention(q, kc, vc, bt, sl, qsl, scale=0.25)
    assert out.dtype == dtype and out.shape == q.shape
    ref = ref_paged_attention(q, kc, vc, bt, sl, qsl, scale=0.25)
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_decode_matches_oracle(group, block_size):
    seq_lens = [1, 17, 100, 65]
    q, kc, vc, bt, sl, _ = make_case(seq_lens, [1] * 4, block_size, 2, group, seed=group)
    be = TorchAttentionBackend(torch.device("cpu"))
    out = be.paged_decode_attention(q, kc, vc, bt, sl, scale=0.125)
    ref = ref_paged_decode_attention(q, kc, vc, bt, sl, scale=0.125)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


def test_decode_differs_when_cache_changes():
    """Guards the oracle comparison: a wrong block read must show up."""
    q, kc, vc, bt, sl, _ = make_case([20, 30], [1, 1], 4, 2, 2)
    be = TorchAttentionBackend(torch.device("cpu"))
    before = be.paged_decode_attention(q, kc, vc, bt, sl, scale=0.25)
    vc[bt[1, 2]] += 1.0  # a block seq 1 reads, seq 0 does not (seq 0 uses 5 blocks of its own)
    after = be.paged_decode_attention(q, kc, vc, bt, sl, scale=0.25)
    torch.testing.assert_close(after[0], before[0])
    assert not torch.allclose(after[1], before[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reshape_and_cache_matches_oracle_and_skips_padding(dtype):
    gen = torch.Generator().manual_seed(3)
    kc = torch.zeros(10, 16, 2, 8, dtype=dtype)
    vc = torch.zeros_like(kc)
    key = torch.randn(6, 2, 8, generator=gen).to(dtype)
    value = torch.randn(6, 2, 8, generator=gen).to(dtype)
    slots = torch.tensor([5, 17, 159, -1, 80, 0], dtype=torch.int64)
    be = TorchAttentionBackend(torch.device("cpu"))
    be.reshape_and_cache(key, value, kc, vc, slots)
    rk, rv = torch.zeros_like(kc), torch.zeros_like(vc)
    ref_reshape_and_cache(key, value, rk, rv, slots)
    assert torch.equal(kc, rk) and torch.equal(vc, rv)
    assert torch.equal(kc[159 // 16, 159 % 16], key[2])
    assert int((kc != 0).any(dim=(2, 3)).sum()) == 5  # the padded token wrote nothing


def test_prefill_then_decode_through_cache_equals_dense_causal():
    """End to end: write a prompt with reshape_and_cache, attend; equals dense causal SDPA."""
    gen = torch.Generator().manual_seed(5)
    T, Hq, Hkv, D, BS = 23, 4, 2, 16, 8
    q = torch.randn(T, Hq, D, generator=gen)
    k = torch.randn(T, Hkv, D, generator=gen)
    v = torch.randn(T, Hkv, D, generator=gen)
    kc = torch.zeros(16, BS, Hkv, D)
    vc = torch.zeros_like(kc)
    table = torch.tensor([[9, 2, 14]], dtype=torch.int32)
    slots = torch.tensor([int(table[0, i // BS]) * BS + i % BS for i in range(T)])
    be = get_attention_backend("torch")  # the default path: the C++ kernel where it builds
    be.reshape_and_cache(k, v, kc, vc, slots)
    out = be.paged_attention(
        q,
        kc,
        vc,
        table,
        torch.tensor([T], dtype=torch.int32),
        torch.tensor([0, T], dtype=torch.int32),
        scale=D**-0.5,
    )
    dense = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.repeat_interleave(2, 1).transpose(0, 1),
        v.repeat_interleave(2, 1).transpose(0, 1),
        is_causal=True,
    ).transpose(0, 1)
    torch.testing.assert_close(out, dense, atol=2e-5, rtol=2e-5)


def test_selector_auto_on_cpu_is_torch():
    be = get_attention_backend("auto", "cpu")
    assert be.name == "torch"
    info = be.describe()
    assert {k: info[k] for k in ("name", "device")} == {"name": "torch", "device": "cpu"}
    assert info["decode_kernel_fp32"] in ("cpp", "split-kv", "gather")
    assert info["decode_kernel_int8"] in ("cpp", "gather")
    assert "torch" in available_backends("cpu")


def test_selector_rejects_unknown_name():
    with pytest.raises(ValueError, match="unknown attention backend 'flash'"):
        get_attention_backend("flash")


def test_decode_long_context_gathers_in_groups():
    """Contexts past the CPU gather budget run one sequence per SDPA call; same answer."""
    q, kc, vc, bt, sl, _ = make_case([1100, 700, 1030], [1] * 3, 16, 8, 1, head_dim=64)
    be = TorchAttentionBackend(torch.device("cpu"))
    out = be.paged_decode_attention(q, kc, vc, bt, sl, scale=0.125)
    ref = ref_paged_decode_attention(q, kc, vc, bt, sl, scale=0.125)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    assert be._workspace is not None
    assert be._workspace.numel() == 2 * 69 * 16 * 8 * 64  # one sequence's 69 blocks at a time


def test_length_hints_as_upper_bounds_change_nothing():
    q, kc, vc, bt, sl, qsl = make_case([50, 7, 20], [1, 1, 1], 8, 2, 4)
    be = TorchAttentionBackend(torch.device("cpu"))
    exact = be.paged_attention(q, kc, vc, bt, sl, qsl, scale=0.25)
    hinted = be.paged_attention(
        q, kc, vc, bt, sl, qsl, scale=0.25, max_query_len=3, max_seq_len=999
    )
    torch.testing.assert_close(hinted, exact, atol=1e-6, rtol=1e-6)  # padding moves rounding
