"""The Triton attention backend: kernels from triton_attention / triton_cache, imported on
first construction so that `cbbench.kernels` never needs triton to import."""

from __future__ import annotations

import os

import torch


class TritonAttentionBackend:
    name = "triton"

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
        if max_query_len is None:
            max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
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
