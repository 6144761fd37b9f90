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
- "bf16-avx2" (bf16, CPUs without oneDNN's bf16 path, e.g. AVX2-only): the bf16 weight packed
  once into 8-output panels and multiplied in fp32 by cbbench.kernels.cpu_linear_bf16 (AVX2,
  or AVX-512 where the compiler targets it; compiled on first use); activations go in as fp32, the output is cast back to bf16. torch's
  own bf16 matmul on such CPUs is far slower than fp32. The bf16 default there when it builds
  and passes a self-check against F.linear in fp32 on the same bf16 weight.
- "bf16-dp" (bf16, CPUs with AVX512-BF16): the bf16 weight packed once into 16-output panels
  of k pairs and multiplied by `vdpbf16ps` (cbbench.kernels.cpu_bf16_dot), bf16 in, fp32
  accumulation, bf16 out as F.linear in bf16. On `small` at 8 rows, one thread: 7.9-8.9 ms for
  a step's linears against oneDNN's 10.5-11.3 (1 row: 6.2-7.4 vs 10.7-11.3; shared machine).
  The bf16 default there when it builds with vdpbf16ps and passes a self-check.
- "column-major": weights stored [in, out] and viewed as [out, in], so the matmul reads them
  contiguously without packing: 10-40% faster. The fallback when the others are missing, fail
  their self-check, or the dtype is float16.

Each result equals `F.linear` up to fp32 summation order ("bf16-avx2": up to the bf16 rounding
of its output, as F.linear in bf16 rounds too). $CBBENCH_CPU_LINEAR (or the `choice` argument)
forces one for A/B runs: auto | panels | onednn | column-major | bf16-avx2 | bf16-dp.

`--quantization int8` (`quantize_cpu_linears`) is not a layout but a change of the weights:
every linear (the LM head too) becomes int8 codes with one fp32 scale per output row, run by
the same C++ kernel ("int8-avx512" or "int8-avx2", "int8-scalar" on a build without AVX2),
activations in
fp32; it equals F.linear over the dequantized weight up to summation order.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from cbbench.kernels import cpu_bf16_dot, cpu_gemm, cpu_linear_bf16
from torch import nn

CHOICES = ("auto", "panels", "onednn", "column-major", "bf16-avx2", "bf16-dp")
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


class Bf16Linear(nn.Module):
    """An nn.Linear whose bf16 weight lives only in cpu_linear_bf16's panels (inference only):
    fp32 compute, the output in the input's dtype."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.panels = cpu_linear_bf16.pack(linear.weight)
        b = linear.bias
        self.bias = None if b is None else b.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = cpu_linear_bf16.linear(x, self.panels, self.bias, self.out_features)
        return y.to(x.dtype)


class DotLinear(nn.Module):
    """An nn.Linear whose bf16 weight lives only in cpu_bf16_dot's grouped panels (inference
    only): bf16 in and out, fp32 accumulation (vdpbf16ps)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.panels = cpu_bf16_dot.pack_grouped(linear.weight)  # one stream: ~1 ms a B=8 step
        b = linear.bias
        self.bias = None if b is None else b.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cpu_bf16_dot.linear(x, self.panels, self.bias, self.out_features)


class Int8Linear(nn.Module):
    """An nn.Linear quantized to int8 codes + an fp32 scale per output row, in
    cpu_linear_bf16's panels (inference only): fp32 compute, the output in the input's dtype."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.panels, self.scales = cpu_linear_bf16.pack_int8(linear.weight)
        b = linear.bias
        self.bias = None if b is None else b.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cpu_linear_bf16.linear_int8(x, self.panels, self.scales, self.bias).to(x.dtype)


def _bf16_unavailable(linear: nn.Linear) -> str | None:
    """Why "bf16-avx2" cannot run `linear` here, or None: build (once) and check the kernel
    against F.linear in fp32 on the same bf16 weight, 1..20 rows (output kept in fp32)."""
    if linear.weight.dtype != torch.bfloat16:
        return f"dtype {linear.weight.dtype} is not bfloat16"
    if cpu_linear_bf16.load() is None:
        return cpu_linear_bf16.unavailable_reason()
    if cpu_linear_bf16.isa() not in ("avx2", "avx512"):
        return "the kernel was compiled without AVX2/FMA"
    gen = torch.Generator().manual_seed(0)
    w = linear.weight.detach().float()
    b = None if linear.bias is None else linear.bias.detach().float()
    with torch.inference_mode():
        panels = cpu_linear_bf16.pack(linear.weight)
        for rows in (1, 3, 9, 20):
            x = torch.randn(rows, linear.in_features, generator=gen)
            want = F.linear(x, w, b)
            got = cpu_linear_bf16.linear(x, panels, b, linear.out_features)
            if not torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max())):
                return "it fails the self-check against F.linear"
    return None


def _dot_unavailable(linear: nn.Linear) -> str | None:
    """Why "bf16-dp" cannot run `linear` here, or None: build (once) with vdpbf16ps and check
    it against F.linear in fp32 on the same bf16 weight and inputs, 1..20 rows."""
    if linear.weight.dtype != torch.bfloat16:
        return f"dtype {linear.weight.dtype} is not bfloat16"
    if cpu_bf16_dot.load() is None:
        return cpu_bf16_dot.unavailable_reason()
    if not cpu_bf16_dot.fast():
        return "the kernel was compiled without AVX512-BF16"
    gen = torch.Generator().manual_seed(0)
    w = linear.weight.detach().float()
    b = None if linear.bias is None else linear.bias.detach().float()
    with torch.inference_mode():
        fast = DotLinear(linear)
        for rows in (1, 3, 9, 20):
            x = torch.randn(rows, linear.in_features, generator=gen).to(torch.bfloat16)
            want = F.linear(x.float(), w, b)
            got = fast(x).float()
            if not torch.allclose(got, want, rtol=1e-2, atol=1e-2 * float(want.abs().max())):
                return "it fails the self-check against F.linear"
    return None


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
    if choice in ("auto", "bf16-dp") and dtype == torch.bfloat16:
        why = _dot_unavailable(first)
        if why is None:
            return "bf16-dp"
        if choice == "bf16-dp":
            raise ValueError(f"CPU linear 'bf16-dp' is unavailable here: {why}")
    if choice == "bf16-dp":
        raise ValueError(f"CPU linear 'bf16-dp' is unavailable here: dtype {dtype} is not bfloat16")
    if choice == "bf16-avx2":
        why = _bf16_unavailable(first)
        if why is not None:
            raise ValueError(f"CPU linear 'bf16-avx2' is unavailable here: {why}")
        return "bf16-avx2"
    onednn = dtype in (torch.float32, torch.bfloat16) and _onednn_ok(first)
    if choice in ("auto", "onednn") and onednn:
        return "onednn"
    if choice == "onednn":
        raise ValueError(f"CPU linear 'onednn' is unavailable here (dtype {dtype})")
    if choice == "auto" and dtype == torch.bfloat16 and _bf16_unavailable(first) is None:
        return "bf16-avx2"
    return "column-major"


def _linears(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    return [(parent, name, child) for parent in model.modules()
            for name, child in parent.named_children() if isinstance(child, nn.Linear)]  # fmt: skip


def quantize_cpu_linears(model: nn.Module) -> str:
    """Swap every nn.Linear of `model` (on the CPU) for an Int8Linear (`--quantization int8`);
    returns "int8-avx512", "int8-avx2" or "int8-scalar". ValueError, one line, where the kernel cannot run."""
    if cpu_linear_bf16.load() is None:
        why = cpu_linear_bf16.unavailable_reason()
        raise ValueError(f"--quantization int8 needs the C++ int8 linear kernel: {why}")
    linears = _linears(model)
    assert linears and all(lin.weight.device.type == "cpu" for _, _, lin in linears)
    first = linears[0][2]
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        fast = Int8Linear(first)
        want_w = cpu_linear_bf16.unpack_int8(fast.panels, fast.scales)
        for rows in (1, 3, 9, 20):
            x = torch.randn(rows, first.in_features, generator=gen)
            want = F.linear(x, want_w, fast.bias)
            got = cpu_linear_bf16.linear_int8(x, fast.panels, fast.scales, fast.bias)
            if not torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max())):
                raise ValueError("--quantization int8: the int8 kernel fails its self-check")
    with torch.no_grad():
        for parent, name, lin in linears:
            setattr(parent, name, Int8Linear(lin))
    return f"int8-{cpu_linear_bf16.isa()}"


def optimize_cpu_linears(
    model: nn.Module, choice: str | None = None, quantization: str | None = None
) -> str:
    """Swap every nn.Linear of `model` (on the CPU) for the fastest layout that works here, or
    `choice` / $CBBENCH_CPU_LINEAR when set (ValueError if it cannot run); returns which one.
    `quantization` "int8": `quantize_cpu_linears` instead. A tied LM head gets its own copy,
    so the embedding keeps its row-major table."""
    if quantization is not None:
        assert quantization == "int8", quantization  # EngineConfig checks the name
        return quantize_cpu_linears(model)
    choice = choice or os.environ.get("CBBENCH_CPU_LINEAR", "").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ValueError(f"CPU linear {choice!r}: choose one of {', '.join(CHOICES)}")
    linears = _linears(model)
    assert linears and all(lin.weight.device.type == "cpu" for _, _, lin in linears)
    impl = _choose(linears[0][2], choice)
    make = {"panels": PanelLinear, "onednn": PackedLinear, "column-major": _column_major,
            "bf16-avx2": Bf16Linear, "bf16-dp": DotLinear}[impl]  # fmt: skip
    with torch.no_grad():
        for parent, name, lin in linears:
            setattr(parent, name, make(lin))
    return impl


def fused_layers_ok(model: nn.Module, impl: str) -> bool:
    """Whether every decoder layer of `model` can run as one cpu_fused call a layer (its
    linears swapped to "panels" in fp32 or "bf16-dp" in bf16, the C++ norms, rope and paged
    attention built, dense MLPs). $CBBENCH_CPU_FUSED=0 keeps the module path (A/B runs)."""
    from cbbench.reference_engine.model.llama import LlamaDecoderLayer, LlamaMLP, RMSNorm

    off = os.environ.get("CBBENCH_CPU_FUSED", "1").strip().lower() in ("0", "false", "no", "off")
    if off or cpu_gemm.load() is None:
        return False
    kind = {"panels": (PanelLinear, torch.float32), "bf16-dp": (DotLinear, torch.bfloat16)}
    if impl not in kind or (impl == "bf16-dp" and not cpu_bf16_dot.fast()):
        return False
    linear_type, dtype = kind[impl]
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers:
        return False
    for layer in layers:
        if type(layer) is not LlamaDecoderLayer or type(layer.mlp) is not LlamaMLP:
            return False
        attn, mlp = layer.self_attn, layer.mlp
        linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        if not all(type(lin) is linear_type for lin in linears):
            return False
        if not all(type(n) is RMSNorm and n.weight.dtype == dtype for n in norms):
            return False
    return True
