"""Faster projections on the CPU, chosen once when the ModelRunner is built.

Decode steps multiply a few rows by every weight: MKL's default path re-packs each weight on
every call and runs a small-M kernel at a fraction of the machine's FLOPs. Two remedies:

- "onednn": weights pre-packed once into oneDNN's blocked layout (`_reorder_linear_weight`,
  the op torch's own CPU compiler uses), then `_linear_pointwise`: about 2x faster at 8 rows.
- "column-major": weights stored [in, out] and viewed as [out, in], so the matmul reads them
  contiguously without packing: 10-40% faster. The fallback when oneDNN is missing, fails the
  self-check, or the dtype is float16.

Either way the result equals `F.linear` up to fp32 summation order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

BATCH_HINT = 8  # rows the oneDNN layout is tuned for: a typical decode batch on the CPU


class PackedLinear(nn.Module):
    """An nn.Linear whose weight lives only in oneDNN's packed layout (inference only)."""

    def __init__(self, linear: nn.Linear, batch_hint: int = BATCH_HINT) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().contiguous()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w, batch_hint)
        self.bias = None if linear.bias is None else linear.bias.detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def _onednn_ok(linear: nn.Linear) -> bool:
    """Pack one layer and compare it with F.linear on random rows."""
    if not (
        torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    ):
        return False
    try:
        x = torch.randn(3, linear.in_features, generator=torch.Generator().manual_seed(0))
        x = x.to(linear.weight.dtype)
        with torch.inference_mode():
            got = PackedLinear(linear)(x).float()
            want = F.linear(x, linear.weight, linear.bias).float()
    except (RuntimeError, NotImplementedError, AttributeError):
        return False
    return bool(torch.allclose(got, want, rtol=1e-3, atol=1e-3 * float(want.abs().max())))


def _column_major(linear: nn.Linear) -> nn.Linear:
    w = linear.weight.detach()
    linear.weight = nn.Parameter(w.t().contiguous().t(), requires_grad=False)
    return linear


def optimize_cpu_linears(model: nn.Module) -> str:
    """Swap every nn.Linear of `model` (on the CPU) for the faster layout; returns which one.
    A tied LM head gets its own copy, so the embedding keeps its row-major table."""
    linears = [(parent, name, child) for parent in model.modules()
               for name, child in parent.named_children() if isinstance(child, nn.Linear)]  # fmt: skip
    assert linears and all(lin.weight.device.type == "cpu" for _, _, lin in linears)
    dtype = linears[0][2].weight.dtype
    use_onednn = dtype in (torch.float32, torch.bfloat16) and _onednn_ok(linears[0][2])
    with torch.no_grad():
        for parent, name, lin in linears:
            setattr(parent, name, PackedLinear(lin) if use_onednn else _column_major(lin))
    return "onednn" if use_onednn else "column-major"
