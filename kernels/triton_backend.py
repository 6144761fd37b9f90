"""The Triton attention backend: kernels from triton_attention / triton_cache, imported on
first construction so that `cbbench.kernels` never needs triton to import.

Launch sizes (splits, query tiles) come from host-side bounds, so that a step on the GPU
never waits on a `.max()` of a device tensor; callers that know the exact maxima may pass
`max_seq_len` / `max_query_len`."""

from __future__ import annotations

import os

import torch
from cbbench.kernels import kv_quant


def _max_seq_len_bound(block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int) -> int:
    """max(seq_lens), exactly when it is on the CPU; on a GPU the bound the block table
    width gives (no device sync; extra splits are empty and weigh nothing in the merge)."""
    if seq_lens.device.type == "cpu":
        return int(seq_lens.max())
    return block_tables.shape[1] * block_size


def _check_cache(k_cache: torch.Tensor, q_dtype: torch.dtype | None = None) -> None:
    """One-line ValueError for a cache these kernels cannot read: fp8, or a float cache of
    another dtype than the model's (int8 they dequantize as they load)."""
    if k_cache.dtype == torch.int8:
        return
    if kv_quant.is_quantized(k_cache) or (q_dtype is not None and k_cache.dtype != q_dtype):
        raise ValueError(
            f"attention backend 'triton' has no kernel for a {k_cache.dtype} KV cache"
            f"{'' if q_dtype is None else f' under a {q_dtype} model'}; use "
            "--attention-backend torch or --kv-cache-dtype auto"
        )


class TritonAttentionBackend:
    name = "triton"
    kv_cache_dtypes = ("auto", "int8")  # fp8 and bf16-under-fp32: the torch backend only

    def __init__(self, device: torch.device) -> None:
        from cbbench.kernels import triton_attention, triton_cache

        self.device = device
        self._attn = triton_attention
        self._cache = triton_cache

    def describe(self) -> dict[str, object]:
        import triton

        return {
            "name": self.name,
            "device": str(self.device),
            "triton": triton.__version__,
            "interpreted": os.environ.get("TRITON_INTERPRET") == "1",
        }

    def reshape_and_cache(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        _check_cache(k_cache)
        self._cache.reshape_and_cache(key, value, k_cache, v_cache, slot_mapping)

    def paged_decode_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        max_seq_len: int | None = None,
    ) -> torch.Tensor:
        _check_cache(k_cache, q.dtype)
        if max_seq_len is None:
            max_seq_len = _max_seq_len_bound(block_tables, seq_lens, k_cache.shape[1])
        return self._attn.paged_decode_attention(
            q, k_cache, v_cache, block_tables, seq_lens, scale, max_seq_len=max_seq_len
        )

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
    ) -> torch.Tensor:
        """Decode-only batches (every qlen 1) take the split-KV decode kernel."""
        _check_cache(k_cache, q.dtype)
        if max_query_len is None:
            if query_start_loc.device.type == "cpu":
                max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
            else:
                max_query_len = q.shape[0]  # an upper bound without a device sync
        if max_query_len == 1 and q.shape[0] == block_tables.shape[0]:
            return self.paged_decode_attention(
                q, k_cache, v_cache, block_tables, seq_lens, scale, max_seq_len=max_seq_len
            )
        return self._attn.paged_prefill_attention(
            q,
            k_cache,
            v_cache,
            block_tables,
            seq_lens,
            query_start_loc,
            scale,
            max_query_len=max_query_len,
        )
