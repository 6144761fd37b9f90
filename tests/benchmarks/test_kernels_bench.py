"""CPU attention speed of the torch backend, the engine's CPU path (pytest-benchmark; skipped
by the default run). Shapes of the `small` preset: 8 KV heads x 64, block size 16, fp32.

Run: python -m pytest tests/benchmarks/test_kernels_bench.py --benchmark-only
"""

from __future__ import annotations

import pytest
import torch
from cbbench.kernels.reference import (
    engine_block_tables,
    make_paged_case,
    ref_paged_decode_attention,
)
from cbbench.kernels.torch_backend import TorchAttentionBackend

KEYS = ("q", "k_cache", "v_cache", "block_tables", "seq_lens")


@pytest.mark.parametrize("context", [300, 1000, 2000])
@pytest.mark.parametrize("batch", [8, 32])
def test_bench_torch_decode(benchmark, batch, context):
    """One layer's decode attention; every sequence at `context` tokens."""
    c = make_paged_case([context] * batch, [1] * batch, 16, 8, 1, head_dim=64)
    args = [c[k] for k in KEYS]
    be = TorchAttentionBackend(torch.device("cpu"))
    out = benchmark(be.paged_decode_attention, *args, 0.125)
    q, k_cache, v_cache, tables, seq_lens = args
    ref = ref_paged_decode_attention(q[:2], k_cache, v_cache, tables[:2], seq_lens[:2], 0.125)
    torch.testing.assert_close(out[:2], ref, atol=2e-5, rtol=2e-5)  # the first two sequences


@pytest.mark.parametrize("split_kv", ["on", "off"])
@pytest.mark.parametrize("context", [300, 1000])
@pytest.mark.parametrize("batch", [8, 32])
def test_bench_torch_decode_engine_layout(benchmark, batch, context, split_kv):
    """Decode on block tables as the block manager lays them out: each prompt (all but the
    last 128 tokens) one run of consecutive blocks, decode blocks interleaved. split_kv on
    reads the runs in place; off gathers every block (the plain path)."""
    lens = [context] * batch
    c = make_paged_case(lens, [1] * batch, 16, 8, 1, head_dim=64)
    tables, used = engine_block_tables(lens, [context - 128] * batch, 16)
    assert c["k_cache"].shape[0] >= used
    args = [c["q"], c["k_cache"], c["v_cache"], tables, c["seq_lens"]]
    be = TorchAttentionBackend(torch.device("cpu"))
    be.split_kv = split_kv == "on"
    out = benchmark(be.paged_decode_attention, *args, 0.125)
    assert (be._plan is not None) == be.split_kv
    q, k_cache, v_cache, _, seq_lens = args
    ref = ref_paged_decode_attention(q[:2], k_cache, v_cache, tables[:2], seq_lens[:2], 0.125)
    torch.testing.assert_close(out[:2], ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("prompt", [128, 512])
def test_bench_torch_prefill(benchmark, prompt):
    """One layer's prefill attention of 4 prompts."""
    c = make_paged_case([prompt] * 4, [prompt] * 4, 16, 8, 1, head_dim=64)
    be = TorchAttentionBackend(torch.device("cpu"))
    out = benchmark(be.paged_attention, *[c[k] for k in (*KEYS, "query_start_loc")], 0.125)
    assert out.shape == (4 * prompt, 8, 64)
