"""The KV cache's storage: the bytes a block takes under `--kv-cache-dtype` and the torch
dtype it is stored in (int8 / fp8 rows carry a one-byte E8M0 scale per token and head,
kernels/kv_quant.py).

One rule for the real pool (ModelRunner, LLMEngine's default sizing) and the simulator's
cost model: one token is `2 * layers * kv_heads * row` bytes, `row` = head_dim x the
element's bytes, + 1 for a quantized row's scale. Torch-free at import (the cost model uses
it); `kv_storage_dtype` imports torch when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.model.config import ModelConfig

if TYPE_CHECKING:
    import torch
    from cbbench.kernels import AttentionBackend

KV_SCALE_BYTES = 1  # == kernels/kv_quant.py SCALE_BYTES (tested)
KV_ELEMENT_BYTES = {"bf16": 2, "fp8": 1, "int8": 1}  # "auto": the model dtype's
QUANTIZED = ("fp8", "int8")
_MODEL_DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}


def kv_token_bytes(mc: ModelConfig, kv_cache_dtype: str, dtype_bytes: int) -> int:
    """K and V of one token over all layers; `dtype_bytes`: the model dtype's element."""
    if kv_cache_dtype == "auto":
        return mc.kv_bytes_per_token(dtype_bytes)
    if kv_cache_dtype not in KV_ELEMENT_BYTES:
        raise EngineError(f"unknown kv_cache_dtype {kv_cache_dtype!r}")
    assert mc.head_dim is not None
    row = mc.head_dim * KV_ELEMENT_BYTES[kv_cache_dtype]
    row += KV_SCALE_BYTES if kv_cache_dtype in QUANTIZED else 0
    return 2 * mc.num_hidden_layers * mc.num_key_value_heads * row


def kv_bytes_per_block(
    model_config: ModelConfig, block_size: int, dtype: str, kv_cache_dtype: str = "auto"
) -> int:
    """Bytes of one block of K and V over all layers; `dtype` is the model's ("auto": its
    checkpoint's torch_dtype)."""
    name = model_config.torch_dtype if dtype == "auto" else dtype
    if name not in _MODEL_DTYPE_BYTES:
        raise EngineError(f"unknown dtype {name!r} (choose from float32, bfloat16, float16)")
    return kv_token_bytes(model_config, kv_cache_dtype, _MODEL_DTYPE_BYTES[name]) * block_size


def kv_storage_dtype(
    kv_cache_dtype: str, model_dtype: torch.dtype, backend: AttentionBackend | None = None
) -> torch.dtype:
    """The cache's torch dtype; EngineError (one line) when this torch lacks it or `backend`
    has no kernel for it (a cache in the model's own dtype every backend reads)."""
    from cbbench.kernels import kv_quant

    try:
        kv = kv_quant.cache_torch_dtype(kv_cache_dtype, model_dtype)
    except ValueError as exc:
        raise EngineError(str(exc)) from None
    if backend is not None and kv != model_dtype and kv_cache_dtype not in backend.kv_cache_dtypes:
        raise EngineError(
            f"attention backend {backend.name!r} has no kernel for --kv-cache-dtype "
            f"{kv_cache_dtype} (it has: {', '.join(backend.kv_cache_dtypes)}); use "
            "--attention-backend torch"
        )
    return kv
