"""Decode attention over an int8 KV cache on the CPU (pytest-benchmark; skipped by the default
run): the C++ int8 kernel (kernels/cpu_kv_attention.py, rows read in place and dequantized as
read) against the torch gather path on the same int8 cache (gather the packed blocks,
dequantize, SDPA) and against the torch path on the fp32 cache. One layer of `small`:
8 KV heads x 64, block size 16, shuffled block tables, every sequence at `context` tokens.

Run: python -m pytest tests/benchmarks/test_kv_quant_cpu_bench.py --benchmark-only
     --benchmark-group-by=param:batch,param:context
"""

from __future__ import annotations

import pytest
import torch
from cbbench.kernels import cpu_kv_attention, kv_quant
from cbbench.kernels.reference import ref_paged_decode_attention
from cbbench.kernels.torch_backend import TorchAttentionBackend

HKV, D, BS, SCALE = 8, 64, 16, 0.125
PATHS = ["int8-cpp", "int8-gather", "fp32-torch"]


def _case(batch: int, context: int) -> dict[str, torch.Tensor]:
    """A pool of exactly the blocks needed, handed out shuffled (no runs to read in place)."""
    gen = torch.Generator().manual_seed(batch * 10_000 + context)
    per = -(-context // BS)
    pool = batch * per
    shape = (pool, BS, HKV, D)
    k, v = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    tables = torch.randperm(pool, generator=gen).view(batch, per).to(torch.int32)
    return {
        "q": torch.randn(batch, HKV, D, generator=gen),
        "k": k,
        "v": v,
        "k8": kv_quant.quantize(k, torch.int8),
        "v8": kv_quant.quantize(v, torch.int8),
        "tables": tables,
        "lens": torch.full((batch,), context, dtype=torch.int32),
    }


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("context", [512, 2048])
@pytest.mark.parametrize("batch", [8, 32])
def test_bench_int8_decode(benchmark, batch, context, path):
    if path == "int8-cpp" and not cpu_kv_attention.available():
        pytest.skip(f"int8 KV C++ kernel: {cpu_kv_attention.unavailable_reason()}")
    c = _case(batch, context)
    be = TorchAttentionBackend(torch.device("cpu"))
    be.paged_kernel = False  # fp32: the torch path (split-KV finds no runs: it gathers)
    be.quant_kernel = path == "int8-cpp"
    kc, vc = (c["k8"], c["v8"]) if path.startswith("int8") else (c["k"], c["v"])
    args = (c["q"], kc, vc, c["tables"], c["lens"], SCALE)
    out = benchmark(be.paged_decode_attention, *args)
    if path.startswith("int8"):
        kc, vc = kv_quant.dequantize(kc), kv_quant.dequantize(vc)
    ref = ref_paged_decode_attention(c["q"][:2], kc, vc, c["tables"][:2], c["lens"][:2], SCALE)
    torch.testing.assert_close(out[:2], ref, atol=2e-5, rtol=2e-5)  # the first two sequences
