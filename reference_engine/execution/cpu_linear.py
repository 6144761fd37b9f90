"""Faster projections on the CPU, chosen once when the ModelRunner is built.

Decode steps multiply a few rows by every weight: MKL's default path re-packs each weight on
every call and runs a small-M kernel at a fraction of the machine's FLOPs. Three remedies:

- "panels" (fp32, AVX-512 CPUs): weights packed into 32-output panels and multiplied by our
  own kernel (cbbench.kernels.cpu_gemm, compiled on first use), which streams each weight
  once per decode step near memory bandwidth. The default when it builds and passes a
  self-check against F.linear.
- "onednn": weights pre-packed once into oneDNN's blocked layout (`_reorder_linear_weight`,
  the op torch's own CPU compiler uses), then `_linear_pointwise`: about 2x faster at 8 rows.
  The default for bf16, and for fp32 where "panels" is unavailable.
- "column-major": weights stored [in, out] and viewed as [out, in], so the matmul reads them
  contiguously without packing: 10-40% faster. The fallback when oneDNN is missing, fails the
  self-check, or the dtype is float16.

Each result equals `F.linear` up to fp32 summation order. $CBBENCH_CPU_LINEAR (or the
`choice` argument) forces one for A/B runs: auto | panels | onednn | column-major.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from cbbench.kernels import cpu_gemm
from torch import nn

CHOICES = ("auto", "panels", "onednn", "column-major")
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


class PanelLinear(nn.Module):
    """An nn.Linear whose fp32 weight lives only in cpu_gemm's panels (inference only)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.panels, self.bias = cpu_gemm.pack(linear.weight, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cpu_gemm.linear(x, self.panels, self.bias, self.out_features)


def _panels_ok(linear: nn.Linear) -> bool:
    """Build (once) and check the panels kernel on `linear` against F.linear, 1..20 rows."""
    if linear.weight.dtype != torch.float32 or cpu_gemm.load() is None:
        return False
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        fast = PanelLinear(linear)
        for rows in (1, 3, 9, 20):
            x = torch.randn(rows, linear.in_features, generator=gen)
            want = F.linear(x, linear.weight, linear.bias)
            if not torch.allclose(fast(x), want, rtol=1e-4, atol=1e-4 * float(want.abs().max())):
                return False
    return True


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


def _choose(first: nn.Linear, choice: str) -> str:
    dtype = first.weight.dtype
    if choice in ("auto", "panels") and _panels_ok(first):
        return "panels"
    if choice == "panels":
        why = cpu_gemm.unavailable_reason() or f"fails the self-check or dtype {dtype} is not fp32"
        raise ValueError(f"CPU linear 'panels' is unavailable here: {why}")
    onednn = dtype in (torch.float32, torch.bfloat16) and _onednn_ok(first)
    if choice in ("auto", "onednn") and onednn:
        return "onednn"
    if choice == "onednn":
        raise ValueError(f"CPU linear 'onednn' is unavailable here (dtype {dtype})")
    return "column-major"


def optimize_cpu_linears(model: nn.Module, choice: str | None = None) -> str:
    """Swap every nn.Linear of `model` (on the CPU) for the fastest layout that works here, or
    `choice` / $CBBENCH_CPU_LINEAR when set (ValueError if it cannot run); returns which one.
    A tied LM head gets its own copy, so the embedding keeps its row-major table."""
    choice = choice or os.environ.get("CBBENCH_CPU_LINEAR", "").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ValueError(f"CPU linear {choice!r}: choose one of {', '.join(CHOICES)}")
    linears = [(parent, name, child) for parent in model.modules()
               for name, child in parent.named_children() if isinstance(child, nn.Linear)]  # fmt: skip
    assert linears and all(lin.weight.device.type == "cpu" for _, _, lin in linears)
    impl = _choose(linears[0][2], choice)
    make = {"panels": PanelLinear, "onednn": PackedLinear, "column-major": _column_major}[impl]
    with torch.no_grad():
        for parent, name, lin in linears:
            setattr(parent, name, make(lin))
    return impl
