"""Paged attention in vectorised torch: the CPU backend of the reference engine.

Decode on CPU over an fp32 or bf16 cache runs the C++ paged kernel (cpu_attention: K/V read
in place through the block table, bf16 widened as read, one call per layer) where the CPU
kernels build. Otherwise decode gathers
every sequence's blocks through the block table in one `index_select`, then
runs one masked `scaled_dot_product_attention` over the batch. On CPU, when long runs of a
batch's blocks are consecutive in the pool (a prompt's blocks usually are), those runs are
read in place instead and merged by log-sum-exp (`torch_split_kv`): the copy is about half
of a decode layer. GQA costs no copy: the G query
heads that share a KV head become G query rows of that head (one query position, so they
share one mask row). Sequences with several query tokens (prefill, chunked prefill, a prefix-cache hit's
tail) run, on CPU over an fp32 or bf16 cache, in the C++ causal prefill kernel (cpu_attention:
all of a step's prefills in one call per layer; `CBBENCH_CPP_PREFILL=0` turns it off for A/B
runs); otherwise one at a time through SDPA.

Quantized (int8 / fp8, kernels/kv_quant.py) and bf16 caches under an fp32 model: the write
quantizes (or casts) each (token, head) row; attention gathers the packed blocks (a quarter
of fp32's bytes) and dequantizes them into the query's dtype before the same SDPA call.
Decode over an int8 cache on CPU runs the C++ int8 kernel instead (cpu_kv_attention: rows
read in place, dequantized as read; any x86-64, built on the first such call) where it
builds; the in-place split-KV views read raw rows, so fp8 caches (and int8 without that
kernel, bf16 without cpu_attention) take the gather path.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from cbbench.kernels import cpu_attention, cpu_kv_attention, kv_quant, torch_split_kv
from cbbench.kernels.kv_layout import GATHER_BYTES

_CPU_GATHER_BYTES = GATHER_BYTES  # K+V gathered per attention call on CPU (kv_layout)


def _check_paged(k_cache: torch.Tensor, v_cache: torch.Tensor, num_q_heads: int) -> None:
    assert k_cache.dim() == 4 and k_cache.shape == v_cache.shape, "cache is [NB, BS, Hkv, D]"
    assert k_cache.dtype == v_cache.dtype, "K and V caches share one dtype"
    assert num_q_heads % k_cache.shape[2] == 0, "GQA needs Hq % Hkv == 0"


class TorchAttentionBackend:
    name = "torch"
    kv_cache_dtypes = kv_quant.KV_CACHE_DTYPES  # every one: quantized through torch ops

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._workspace: torch.Tensor | None = None  # gather buffer, grown on demand
        # fp32 / bf16 decode on CPU: the C++ kernel (cpu_attention), read in place; else split-KV
        self.paged_kernel = device.type == "cpu" and cpu_attention.available()
        # prefill chunks on CPU over an fp32 / bf16 cache: the C++ causal kernel, else SDPA
        off = os.environ.get("CBBENCH_CPP_PREFILL", "").strip().lower() in ("0", "off", "false", "no")
        self.prefill_kernel = self.paged_kernel and not off
        # int8 decode on CPU: the C++ int8 kernel (cpu_kv_attention), built on first use
        self.quant_kernel = device.type == "cpu"
        self.split_kv = device.type == "cpu" and torch_split_kv.available()
        self.split_kv_min_run_bytes = torch_split_kv.MIN_RUN_BYTES  # tests lower it
        # split plan of the last decode call, reused while the step's layers run
        self._plan_key: tuple[tuple[object, ...], torch.Tensor, torch.Tensor] | None = None
        self._plan: torch_split_kv.SplitPlan | None = None

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "device": str(self.device), **self.decode_kernels()}

    def decode_kernels(self) -> dict[str, str]:
        """Which decode kernel runs per cache kind: "cpp" (in place), "split-kv" or "gather"
        (torch); the int8 C++ kernel is built here if it was not yet."""
        cpu = self.device.type == "cpu"
        fp32 = "cpp" if self.paged_kernel else ("split-kv" if self.split_kv and cpu else "gather")
        int8 = "cpp" if self.quant_kernel and cpu_kv_attention.available() else "gather"
        prefill = "cpp" if self.prefill_kernel else "sdpa"
        return {"decode_kernel_fp32": fp32, "decode_kernel_bf16": fp32, "decode_kernel_int8": int8,
                "prefill_kernel": prefill}  # fmt: skip

    def reshape_and_cache(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Write key/value [T, Hkv, D] into their slots (block * BS + offset); slot < 0 skips."""
        assert key.shape == value.shape and key.shape[0] == slot_mapping.shape[0]
        slots = slot_mapping.long()
        keep = slots >= 0
        if not bool(keep.all()):
            slots, key, value = slots[keep], key[keep], value[keep]
        flat_k = _bytes(k_cache).view(-1, *k_cache.shape[2:])
        flat_v = _bytes(v_cache).view(-1, *v_cache.shape[2:])
        if kv_quant.is_quantized(k_cache):  # quantize on the write: codes + scale per row
            key = kv_quant.quantize(key, k_cache.dtype)
            value = kv_quant.quantize(value, k_cache.dtype)
        flat_k.index_copy_(0, slots, _bytes(key.to(k_cache.dtype)))
        flat_v.index_copy_(0, slots, _bytes(value.to(v_cache.dtype)))

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
        """q [B, Hq, D], one query per sequence at position seq_lens[b] - 1 -> [B, Hq, D].
        `max_seq_len` (optional, exact or an upper bound) spares reading seq_lens back."""
        num_seqs, num_q_heads, head_dim = q.shape
        _check_paged(k_cache, v_cache, num_q_heads)
        _, block_size, num_kv_heads, _ = k_cache.shape
        group = num_q_heads // num_kv_heads
        convert = k_cache.dtype != q.dtype  # quantized or narrower: dequantize what is gathered
        if self.paged_kernel and cpu_attention.supports(q, k_cache):  # fp32 / bf16, in place
            return cpu_attention.paged_decode_attention(
                q, k_cache, v_cache, block_tables, seq_lens, scale
            )
        if self.quant_kernel and cpu_kv_attention.supports(q, k_cache):  # int8, in place
            return cpu_kv_attention.paged_decode_attention(
                q, k_cache, v_cache, block_tables, seq_lens, scale
            )
        query = q.view(num_seqs, num_kv_heads, group, head_dim)
        if self.split_kv and not convert and q.device.type == "cpu":
            plan = self._split_plan(block_tables, seq_lens, k_cache)
            if plan is not None:
                out = torch_split_kv.split_kv_decode(
                    query, k_cache, v_cache, plan, scale, self._gather
                )
                return out.view(num_seqs, num_q_heads, head_dim)
        if max_seq_len is None:
            max_seq_len = int(seq_lens.max())
        num_blocks = min(-(-max_seq_len // block_size), block_tables.shape[1])
        padded = num_blocks * block_size
        # On CPU, gather a few sequences at a time so the copy is still in cache when
        # attention reads it (measured: about 2x faster at 1k context than the whole batch).
        per_seq = 2 * padded * num_kv_heads * head_dim * q.element_size()
        step = num_seqs if q.device.type != "cpu" else max(1, _CPU_GATHER_BYTES // per_seq)
        positions = torch.arange(padded, device=q.device)
        mask = positions[None, :] < seq_lens.to(q.device).long()[:, None]  # [B, L]
        tables = block_tables[:, :num_blocks].long()
        out = torch.empty_like(query)
        for s in range(0, num_seqs, step):
            e = min(num_seqs, s + step)
            k, v = self._gather(k_cache, v_cache, tables[s:e].reshape(-1))
            if convert:
                k, v = kv_quant.to_compute(k, q.dtype), kv_quant.to_compute(v, q.dtype)
            shape = (e - s, padded, num_kv_heads, head_dim)  # -> [n, Hkv, L, D] views
            out[s:e] = F.scaled_dot_product_attention(
                query[s:e],
                k.view(shape).transpose(1, 2),
                v.view(shape).transpose(1, 2),
                attn_mask=mask[s:e, None, None, :],
                scale=scale,
            )
        return out.view(num_seqs, num_q_heads, head_dim)

    def _split_plan(
        self, block_tables: torch.Tensor, seq_lens: torch.Tensor, k_cache: torch.Tensor
    ) -> torch_split_kv.SplitPlan | None:
        """The split plan of this batch, built once per step: every layer passes equal
        tables and lengths (compared by value, a few microseconds)."""
        shape = (tuple(k_cache.shape[1:]), k_cache.element_size(), self.split_kv_min_run_bytes)
        old = self._plan_key
        if (
            old is not None
            and old[0] == shape
            and old[1].shape == block_tables.shape
            and old[2].shape == seq_lens.shape
            and torch.equal(old[1], block_tables)
            and torch.equal(old[2], seq_lens)
        ):
            return self._plan
        block_bytes = k_cache[0].numel() * k_cache.element_size()
        self._plan = torch_split_kv.plan_split(
            block_tables.tolist(),
            seq_lens.tolist(),
            k_cache.shape[1],
            block_bytes,
            self.split_kv_min_run_bytes,
        )
        self._plan_key = (shape, block_tables.clone(), seq_lens.clone())
        return self._plan

    def _gather(
        self, k_cache: torch.Tensor, v_cache: torch.Tensor, ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy blocks `ids` of both caches into reused buffers: [len(ids), BS, Hkv, D] each."""
        dtype = k_cache.dtype
        k_cache, v_cache = _bytes(k_cache), _bytes(v_cache)
        shape = (ids.numel(), *k_cache.shape[1:])
        need = 2 * ids.numel() * k_cache[0].numel()
        buf = self._workspace
        if buf is None or buf.numel() < need or buf.dtype != k_cache.dtype:
            buf = torch.empty(need, dtype=k_cache.dtype, device=k_cache.device)
            self._workspace = buf
        half = need // 2
        k = torch.index_select(k_cache, 0, ids, out=buf[:half].view(shape))
        v = torch.index_select(v_cache, 0, ids, out=buf[half:need].view(shape))
        return k.view(dtype), v.view(dtype)

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
        """Varlen causal attention: seq b's queries q[query_start_loc[b]:query_start_loc[b+1]]
        sit at positions seq_lens[b] - qlen_b + i and see cached positions 0..their own.
        `max_query_len` / `max_seq_len` are accepted for interface parity with the Triton
        backend (this one reads the lengths on the host anyway)."""
        num_tokens, num_q_heads, head_dim = q.shape
        _check_paged(k_cache, v_cache, num_q_heads)
        starts = query_start_loc.tolist()
        lens = seq_lens.tolist()
        qlens = [starts[b + 1] - starts[b] for b in range(len(lens))]
        assert starts[-1] == num_tokens, "query_start_loc[-1] must equal the number of tokens"
        assert all(0 <= ql <= sl for ql, sl in zip(qlens, lens, strict=True)), (
            "qlen must be <= seq_len"
        )
        decode = [b for b, ql in enumerate(qlens) if ql == 1]
        if len(decode) == len(lens):
            return self.paged_decode_attention(
                q, k_cache, v_cache, block_tables, seq_lens, scale, max_seq_len=max_seq_len
            )
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        if decode:
            rows = torch.tensor([starts[b] for b in decode], device=q.device)
            idx = torch.tensor(decode, device=block_tables.device)
            out[rows] = self.paged_decode_attention(
                q[rows], k_cache, v_cache, block_tables[idx], seq_lens[idx], scale
            )
        if self.prefill_kernel and cpu_attention.supports_prefill(q, k_cache):
            return cpu_attention.paged_prefill_attention(
                q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, out
            )  # every sequence with 2 or more queries, in one call
        for b, qlen in enumerate(qlens):
            if qlen > 1:
                out[starts[b] : starts[b + 1]] = self._prefill_one(
                    q[starts[b] : starts[b + 1]], k_cache, v_cache, block_tables[b], lens[b], scale
                )
        return out

    def _prefill_one(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        seq_len: int,
        scale: float,
    ) -> torch.Tensor:
        qlen, num_q_heads, head_dim = q.shape
        _, block_size, num_kv_heads, _ = k_cache.shape
        group = num_q_heads // num_kv_heads
        num_blocks = -(-seq_len // block_size)
        ids = block_table[:num_blocks].long()
        k = _select(k_cache, ids).view(-1, *k_cache.shape[2:])[:seq_len]
        v = _select(v_cache, ids).view(-1, *v_cache.shape[2:])[:seq_len]
        if k.dtype != q.dtype:  # a quantized or bf16 cache: attend in the query's dtype
            k, v = kv_quant.to_compute(k, q.dtype), kv_quant.to_compute(v, q.dtype)
        # [Hkv, G * qlen, D]: query heads of one KV group stacked as rows
        query = q.view(qlen, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
        query = query.reshape(num_kv_heads, group * qlen, head_dim)
        # bottom-right causal: query i (position seq_len - qlen + i) sees keys 0..that position
        q_pos = torch.arange(seq_len - qlen, seq_len, device=q.device)
        k_pos = torch.arange(seq_len, device=q.device)
        mask = (k_pos[None, :] <= q_pos[:, None]).repeat(group, 1)  # [G * qlen, L]
        out = F.scaled_dot_product_attention(
            query, k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale
        )
        out = out.view(num_kv_heads, group, qlen, head_dim).permute(2, 0, 1, 3)
        return out.reshape(qlen, num_q_heads, head_dim)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """fp8 tensors as their bytes: index_copy_ / index_select have no fp8 kernels on CPU."""
    return t.view(torch.uint8) if t.dtype == kv_quant.fp8_dtype() else t


def _select(cache: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return _bytes(cache).index_select(0, ids).view(cache.dtype)
