"""bf16-weight projections on the CPU side by side (pytest-benchmark; skipped by the default
run): the fp32 linear the engine picks here (cpu_linear's best available: panels, oneDNN or
column-major) vs the bf16 kernel (kernels/cpu_linear_bf16.py, "bf16-avx2") vs torch's own bf16
matmul on a column-major weight ("column-major" in bf16). Shapes of the `small` preset's
projections, 1 / 8 / 32 rows (decode batches), one thread.

Run: python -m pytest tests/benchmarks/test_cpu_linear_bf16_bench.py --benchmark-only \\
       --benchmark-group-by=param:shape,param:rows --benchmark-columns=median,ops
"""

from __future__ import annotations

import pytest
import torch
from cbbench.kernels import cpu_linear_bf16
from cbbench.reference_engine.execution import cpu_linear
from torch import nn

# (in, out) of small's qkv, o, gate_up, down projections and its LM head
SHAPES = {"qkv": (512, 1536), "o": (512, 512), "gate_up": (512, 4096), "down": (2048, 512),
          "lm_head": (512, 32000)}  # fmt: skip
IMPLS = ("fp32-best", "bf16-kernel", "torch-bf16")


def make(impl: str, k_in: int, n_out: int) -> nn.Module:
    lin = nn.Linear(k_in, n_out, bias=False)
    if impl == "fp32-best":
        model = nn.Sequential(lin)
        cpu_linear.optimize_cpu_linears(model)
        return model
    lin = lin.to(torch.bfloat16)
    if impl == "bf16-kernel":
        if not cpu_linear_bf16.available():
            pytest.skip(f"bf16 kernel: {cpu_linear_bf16.unavailable_reason()}")
        return cpu_linear.Bf16Linear(lin)
    return cpu_linear._column_major(lin)


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("rows", [1, 8, 32])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_bench_projection(benchmark, one_thread, monkeypatch, shape, rows, impl):
    monkeypatch.delenv("CBBENCH_CPU_LINEAR", raising=False)
    k_in, n_out = SHAPES[shape]
    mod = make(impl, k_in, n_out)
    dtype = torch.float32 if impl == "fp32-best" else torch.bfloat16
    x = torch.randn(rows, k_in, generator=torch.Generator().manual_seed(0)).to(dtype)
    with torch.inference_mode():
        out = benchmark(mod, x)
    assert out.shape == (rows, n_out) and out.dtype == dtype
