"""cbbench.kernels: paged-attention backends over the engine's block-table KV cache.

Cache layout, per layer: K and V each `[num_blocks, block_size, num_kv_heads, head_dim]`;
a token's slot is `block * block_size + offset`.

Backends: "torch" (vectorised torch, any device; the CPU path) and "triton" (Triton kernels;
CUDA, or CPU tensors under `TRITON_INTERPRET=1` for testing). Triton is imported lazily, so
CPU users without it never fail at import.

KV-cache dtypes (`--kv-cache-dtype`, kv_quant.py): a backend lists the ones it has kernels
for in `kv_cache_dtypes`; an int8/fp8 cache's rows are `head_dim` codes plus a 2-byte fp16
scale, quantized in `reshape_and_cache` and dequantized inside attention. A backend given a
cache it has no kernel for raises a one-line ValueError naming itself and the dtype.

Layer: kernels (the bottom, beside workloads).
Imports: nothing.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # torch is imported where it is used: the simulated executor's engine
    import torch  # (kv_layout, the cost model) runs without it, ~1.2 s sooner per start

BACKEND_NAMES = ("auto", "torch", "triton")


class AttentionBackend(Protocol):
    name: str
    kv_cache_dtypes: tuple[str, ...]  # the --kv-cache-dtype values it has kernels for

    def describe(self) -> dict[str, object]: ...

    def reshape_and_cache(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None: ...

    def paged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        scale: float,
        max_query_len: int | None = None,
        max_seq_len: int | None = None,
    ) -> torch.Tensor: ...

    def paged_decode_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        max_seq_len: int | None = None,
    ) -> torch.Tensor: ...


def triton_unavailable_reason(device: str | torch.device) -> str | None:
    """Why the Triton backend cannot run on `device`, or None when it can."""
    if importlib.util.find_spec("triton") is None:
        return "the 'triton' package is not installed (pip install 'cbbench[gpu]')"
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return "CUDA is not available to torch"
        return None
    if dev.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        return _interpreter_mismatch()
    return f"Triton kernels need a CUDA device (got {dev}; CPU only with TRITON_INTERPRET=1)"


def _interpreter_mismatch() -> str | None:
    """triton.jit reads TRITON_INTERPRET when it decorates: a triton imported before the
    variable was set (torch._dynamo imports it) keeps a compiled standard library (tl.max,
    tl.sum), which the interpreter then refuses inside every kernel."""
    if "triton" not in sys.modules:
        return None
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(tl.max, InterpretedFunction):
        return None
    return (
        "triton was imported before TRITON_INTERPRET=1 was set, so its kernels would not be "
        "interpreted; set TRITON_INTERPRET=1 before the process starts"
    )


def available_backends(device: str | torch.device = "cpu") -> list[str]:
    """The backend names that can run on `device` here ("torch" always can)."""
    names = ["torch"]
    if triton_unavailable_reason(device) is None:
        names.append("triton")
    return names


def get_attention_backend(
    name: str = "auto", device: str | torch.device = "cpu"
) -> AttentionBackend:
    """ "auto": Triton on CUDA when it can run there, else torch. "torch" / "triton" force one;
    forcing triton where it cannot run raises ValueError saying why. The returned backend's
    `name` and `describe()` say which one was chosen, for start-up logs and run results."""
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown attention backend {name!r}; choose from {BACKEND_NAMES}")
    import torch

    dev = torch.device(device)
    if name in ("auto", "triton") and (name == "triton" or dev.type == "cuda"):
        reason = triton_unavailable_reason(dev)
        if reason is None:
            try:
                from cbbench.kernels.triton_backend import TritonAttentionBackend

                return TritonAttentionBackend(dev)
            except ImportError as exc:  # installed but broken
                reason = f"importing triton failed: {exc}"
        if name == "triton":
            raise ValueError(f"attention backend 'triton' cannot run: {reason}")
    from cbbench.kernels.torch_backend import TorchAttentionBackend

    return TorchAttentionBackend(dev)


__all__ = [
    "BACKEND_NAMES",
    "AttentionBackend",
    "available_backends",
    "get_attention_backend",
    "triton_unavailable_reason",
]
