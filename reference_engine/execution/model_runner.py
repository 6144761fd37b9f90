"""ModelRunner: the real Executor. It owns the model, the paged KV cache and the sampler, and
runs each step's chunks as one flattened varlen forward.

KV cache: one tensor `[layers, 2, num_kv_blocks, block_size, num_kv_heads, head_dim]`; block
ids are the engine's (BlockManager's), a token's slot is `block * block_size + pos % block_size`.

Over 400 lines because preparing a step, running it and keeping what the engine reads after
it (sampled tokens, logprobs, pooled embeddings) share the step's batch and rows.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass

import torch
from cbbench.kernels import (
    cpu_bf16_dot,
    cpu_kv_attention,
    cpu_ops,
    get_attention_backend,
    kv_quant,
)
from cbbench.reference_engine.core.executor import PLACEHOLDER, ScheduledChunk
from cbbench.reference_engine.core.outputs import TokenLogprob
from cbbench.reference_engine.core.sequence import Sequence
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution import hugepages
from cbbench.reference_engine.execution.cpu_linear import fused_layers_ok, optimize_cpu_linears
from cbbench.reference_engine.execution.cuda_graphs import DecodeGraphs, capture_sizes
from cbbench.reference_engine.execution.expert_predictor import ExpertPredictor
from cbbench.reference_engine.execution.kv_cache import kv_bytes_per_block, kv_storage_dtype
from cbbench.reference_engine.execution.pooling import pooled
from cbbench.reference_engine.execution.rejection_sampler import RejectionSampler, sample_chunks
from cbbench.reference_engine.execution.sampler import Sampler, SampleRequest, token_logprobs
from cbbench.reference_engine.kv_transfer.payload import KVLayout
from cbbench.reference_engine.model import cpu_fused
from cbbench.reference_engine.model.config import PRESETS, ModelConfig
from cbbench.reference_engine.model.llama import (
    AttentionMetadata,
    LlamaAttention,
    LlamaMLP,
    RMSNorm,
)
from cbbench.reference_engine.model.loader import (
    load_model,
    random_model,
    resolve_config,
    resolve_dtype,
)

SMALL_MODEL_PARAMS = 20_000_000  # below this, ops are too small to gain from more threads
THREADS_ENV = "CBBENCH_TORCH_THREADS"


@dataclass
class Batch:
    """One step's flattened inputs, on the model's device."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    max_position: int
    meta: AttentionMetadata
    sample_rows: list[tuple[int, int]]  # (chunk index, row of its last token) for sampling chunks


def default_num_threads(model_config: ModelConfig) -> int:
    """$CBBENCH_TORCH_THREADS if set; else one CPU less than this process may run on
    (cgroup/affinity aware), at least one, and exactly one for models under
    SMALL_MODEL_PARAMS. OpenMP threads wait for each other at every op: when anything else
    needs a core (the server's own Python, a load generator on the same machine), a thread
    per core stalls them all, measured several times slower than one thread here."""
    env = os.environ.get(THREADS_ENV)
    if env:
        if not env.isdigit() or int(env) < 1:
            raise EngineError(f"${THREADS_ENV} must be a positive integer, got {env!r}")
        return int(env)
    if model_config.num_params() < SMALL_MODEL_PARAMS:
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, cpus - 1)


class ModelRunner:
    runs_in_thread = True  # async scheduling: `run` on a worker thread (kernels drop the GIL)

    def __init__(
        self,
        model: str,
        *,
        num_kv_blocks: int,
        block_size: int,
        device: str = "cpu",
        dtype: str = "float32",
        attention_backend: str = "auto",
        seed: int = 0,
        num_threads: int | None = None,
        enforce_eager: bool = True,
        max_num_seqs: int | None = None,
        max_model_len: int | None = None,
        padded_decode: bool = False,
        kv_cache_dtype: str = "auto",
        quantization: str | None = None,
    ) -> None:
        """Decode graphs (cuda_graphs.py): on CUDA unless `enforce_eager` (True here, so
        direct users such as runner_bench and the draft proposer stay eager; the engine passes
        EngineConfig.enforce_eager, False by default), buckets up to
        `max_num_seqs`, block tables up to `max_model_len` (default: the model's context).
        `padded_decode` runs the same padded static-buffer path eagerly on any device (the
        CPU tests of the graph path). `kv_cache_dtype` (auto | bf16 | fp8 | int8): the KV
        cache's storage, kernels/kv_quant.py; the backend must have kernels for it."""
        if num_kv_blocks < 1 or block_size < 1:
            raise EngineError(
                f"num_kv_blocks and block_size must be >= 1, got {num_kv_blocks}, {block_size}"
            )
        self.device = torch.device(device)
        if quantization is not None and self.device.type != "cpu":  # int8 weights: a CPU kernel
            raise EngineError(f"--quantization {quantization}: CPU only, not device {device!r}")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise EngineError(
                f"--device {device}: CUDA is not available to torch {torch.__version__} (a CPU "
                "build, or no NVIDIA driver); use --device cpu"
            )
        try:
            self.backend = get_attention_backend(attention_backend, self.device)
        except ValueError as exc:
            raise EngineError(str(exc)) from None
        config = resolve_config(model)  # a preset, or the folder's config.json
        if self.device.type == "cpu":
            torch.set_num_threads(num_threads or default_num_threads(config))
        self.model = (random_model(config, dtype, self.device, seed) if model in PRESETS
                      else load_model(model, dtype, self.device))  # fmt: skip
        self.model_config: ModelConfig = self.model.config
        # the CPU's layout or int8 kernel (cpu_linear.py), else "torch"; first builds happen here
        self.linear_impl = "torch"
        if self.device.type == "cpu":
            try:
                self.linear_impl = optimize_cpu_linears(self.model, quantization=quantization)
            except ValueError as exc:  # $CBBENCH_CPU_LINEAR / --quantization cannot run here
                raise EngineError(str(exc)) from None
            fp32 = self.model.model.embed_tokens.weight.dtype == torch.float32
            plain_kv = kv_cache_dtype == "auto"  # the fused write stores fp32 rows only
            if cpu_ops.available() and fp32:
                for m in self.model.modules():  # C++ norms, silu * up, rope + cache write
                    if isinstance(m, (RMSNorm, LlamaMLP)) or (
                        isinstance(m, LlamaAttention) and plain_kv
                    ):
                        m.cpu_kernel = True
            bf16 = self.model.model.embed_tokens.weight.dtype == torch.bfloat16
            if bf16 and cpu_bf16_dot.fast():  # their bf16 twins (HF's rounding, one pass)
                for m in self.model.modules():
                    if isinstance(m, RMSNorm) or (isinstance(m, LlamaAttention) and plain_kv):
                        m.cpu_kernel = True
            if plain_kv and fused_layers_ok(self.model, self.linear_impl):  # cpu_fused.py
                for m in self.model.model.layers:
                    m.cpu_fused = "float32" if fp32 else "bfloat16"
            self.weights_arena = hugepages.move_module(self.model)  # after packing: the panels
            cpu_fused.forget(self.model.model.layers)  # plans read the moved weights
        self.dtype = resolve_dtype(dtype, self.model_config)
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_dtype = kv_storage_dtype(kv_cache_dtype, self.dtype, self.backend)
        if self.kv_dtype == torch.int8 and getattr(self.backend, "quant_kernel", False):
            cpu_kv_attention.load()  # its first build (~1 min) at start-up, not in a decode
        self.block_size = block_size
        self.num_kv_blocks = num_kv_blocks
        cfg = self.model_config
        assert cfg.head_dim is not None
        # MoE layers read their expert counts back to split the batch: not capturable, eager
        use_graphs = self.device.type == "cuda" and not enforce_eager and not cfg.is_moe
        want_padded = (use_graphs or padded_decode) and max_num_seqs is not None
        kv_shape = (
            cfg.num_hidden_layers,
            2,
            num_kv_blocks + (1 if want_padded else 0),  # + the padded rows' scratch block
            block_size,
            cfg.num_key_value_heads,
            kv_quant.row_width(cfg.head_dim, self.kv_dtype),  # int8 / fp8: + the row's scale
        )
        self.hugepages: str | None = None  # the start-up line: weights and KV cache
        if self.device.type == "cpu":  # huge pages: the decode step streams both
            self.kv_cache, kv_arena = hugepages.zeros(kv_shape, self.kv_dtype)
            self.hugepages = f"{self.weights_arena.status}; {kv_arena.status}"
        else:
            self.kv_cache = torch.zeros(kv_shape, dtype=self.kv_dtype, device=self.device)
        self.sampler = Sampler(cfg.eos_token_ids, self.device, seed)
        self.rejection_sampler = RejectionSampler(self.device, seed)
        self.decode_graphs: DecodeGraphs | None = None
        self.expert_predictor: ExpertPredictor | None = None  # enable_expert_prediction()
        if want_padded:
            assert max_num_seqs is not None
            max_len = max_model_len or cfg.max_position_embeddings
            self.decode_graphs = DecodeGraphs(
                self.model,
                self.backend,
                self.kv_cache,
                sizes=capture_sizes(max_num_seqs),
                block_size=block_size,
                max_blocks_per_seq=-(-max_len // block_size),
                scratch_block=num_kv_blocks,
                use_cuda_graphs=use_graphs,
            )
            if use_graphs:
                try:
                    self.decode_graphs.capture()
                except Exception as exc:  # a device or kernel that cannot be captured
                    warnings.warn(
                        f"CUDA graph capture failed ({type(exc).__name__}: {exc}); decode "
                        "runs eagerly, as with --enforce-eager",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                    self.decode_graphs = None
                    torch.cuda.synchronize()

    @property
    def attention_backend_name(self) -> str:
        return self.backend.name

    # --- KV transfer (prefill/decode roles; engine/disagg.py) -------------------------------
    def kv_layout(self) -> KVLayout:
        c = self.kv_cache
        return KVLayout(c.shape[0], c.shape[3], c.shape[4], c.shape[5], str(c.dtype))

    def kv_payload_bytes(self, num_blocks: int) -> int:
        c = self.kv_cache
        return c.shape[0] * 2 * num_blocks * c.shape[3] * c.shape[4] * c.shape[5] * c.element_size()

    def export_kv(self, block_ids: list[int]) -> bytes:
        """The blocks' K and V over all layers, in the cache's storage dtype, as bytes."""
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        # as raw bytes: index_select / index_copy_ have no fp8 kernels on some devices (CPU)
        blocks = self.kv_cache.view(torch.uint8).index_select(2, idx).contiguous().cpu()
        return blocks.numpy().tobytes()

    def import_kv(self, block_ids: list[int], data: bytes) -> None:
        """Write an `export_kv` payload into these blocks (same layout: checked by the caller)."""
        c = self.kv_cache.view(torch.uint8)  # the same bytes in any storage dtype (fp8 too)
        shape = (c.shape[0], 2, len(block_ids), *c.shape[3:])
        src = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(shape)
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        c.index_copy_(2, idx, src.to(self.device))

    def expert_load(self) -> list[list[int]] | None:
        """MoE models: tokens routed to each expert of each decoder layer since the start
        ([layer][expert], one device read; [] for a dense layer); None for dense models."""
        cfg = self.model_config
        if not cfg.is_moe:
            return None
        rows = iter(self.model.expert_load().tolist())
        return [next(rows) if cfg.is_sparse_layer(i) else [] for i in range(cfg.num_hidden_layers)]

    def enable_expert_prediction(self) -> None:
        """MoE models: learn each request's routing (the expert-balance scheduler)."""
        if self.model_config.is_moe and self.expert_predictor is None:
            self.expert_predictor = ExpertPredictor(self.model)

    def expert_histogram(self, seq: Sequence) -> list[float] | None:
        p = self.expert_predictor
        return p.histogram(seq.request_id, seq.prompt_token_ids) if p is not None else None

    kv_bytes_per_block = staticmethod(kv_bytes_per_block)  # (model_config, block_size, dtype, kv)

    def now(self) -> float:
        return time.monotonic()

    supports_logprobs = True  # the engine reads `last_logprobs` after each execute

    def execute(self, chunks: list[ScheduledChunk]) -> list[list[int]]:
        self.last_logprobs: dict[str, list[TokenLogprob]] = {}
        if not chunks:
            return []
        return self.run(self.prepare(chunks))

    # --- the two halves of execute(), for async scheduling -------------------------------
    def prepare(self, chunks: list[ScheduledChunk]) -> PreparedStep:
        """Snapshot everything the step needs from the sequences (input tensors, sampling
        requests, drafts): after this the sequences may change while `run` computes."""
        b = prepare_batch(chunks, self.block_size, self.model_config.vocab_size, self.device)
        reqs: list[SampleRequest] = []
        prev, j = -1, 0
        for i, _ in b.sample_rows:  # a chunk's rows are consecutive: j = row within chunk
            j = j + 1 if i == prev else 0
            prev = i
            seq = chunks[i].seq
            reqs.append(
                SampleRequest(seq.sampling_params, seq.num_tokens + j, seq.num_output_tokens + j)
            )
        drafts = [list(c.spec_token_ids) for c in chunks]
        q = [torch.stack(c.spec_draft_probs) if c.spec_draft_probs else None for c in chunks]
        return PreparedStep(b, reqs, drafts, [c.seq.request_id for c in chunks], q)

    def patch(self, step: PreparedStep, rows: list[int], tokens: list[int]) -> None:
        """Replace placeholder input ids (rows of the flattened batch) by the real tokens."""
        ids = step.batch.input_ids
        ids[rows] = to_device(torch.tensor(tokens, dtype=ids.dtype), ids.device)

    def run(self, step: PreparedStep) -> list[list[int]]:
        self.last_logprobs = {}
        b = step.batch
        with torch.inference_mode():
            graphs = self.decode_graphs
            size = graphs.bucket(b) if graphs is not None and not any(step.drafts) else None
            if size is not None:
                assert graphs is not None
                hidden = graphs.run(b, size)  # padded to its bucket, dummy rows dropped
            else:
                hidden = self.model(
                    b.input_ids, b.positions, b.max_position, self.kv_cache, b.meta, self.backend
                )
                if self.expert_predictor is not None:
                    self.expert_predictor.observe(
                        b.input_ids, b.meta.query_start_loc, step.request_ids
                    )
            self.last_embeddings = pooled(hidden, step)  # pooling requests (pooling.py)
            if not b.sample_rows:
                return [[] for _ in step.drafts]
            sample = [row for _, row in b.sample_rows]
            if len(sample) != hidden.shape[0] or sample[-1] != len(sample) - 1:
                hidden = hidden[sample]  # rows are increasing: all of them means 0..T-1
            logits = self.model.compute_logits(hidden)
            rows = [i for i, _ in b.sample_rows]
            wanted = [
                r for r, q in enumerate(step.sample_requests) if q.params.logprobs is not None
            ]
            # raw logits, before the sampler masks stop tokens in place
            lps = torch.log_softmax(logits[wanted].float(), dim=-1) if wanted else None
            out = sample_chunks(
                self.sampler, self.rejection_sampler, logits, step.sample_requests, rows,
                step.drafts, step.draft_probs,
            )  # fmt: skip
            if lps is not None:
                self._keep_logprobs(step, rows, wanted, lps, out)
            return out

    def _keep_logprobs(self, step: PreparedStep, rows, wanted, lps, out) -> None:
        """Per-token logprobs of the chunks that asked, for the engine to attach to their
        outputs (token j of a chunk was sampled from that chunk's j-th logits row)."""
        reqs = step.sample_requests
        first_row: dict[int, int] = {}
        for r, c in enumerate(rows):
            first_row.setdefault(c, r)
        where = {r: k for k, r in enumerate(wanted)}
        for c, toks in enumerate(out):
            if not toks or first_row.get(c) not in where:
                continue
            picked = [where[first_row[c] + j] for j in range(len(toks))]
            k = reqs[first_row[c]].params.logprobs or 0
            self.last_logprobs[step.request_ids[c]] = token_logprobs(lps[picked], toks, k)


@dataclass
class PreparedStep:
    batch: Batch
    sample_requests: list[SampleRequest]
    drafts: list[list[int]]  # per chunk
    request_ids: list[str]  # per chunk
    draft_probs: list[torch.Tensor | None] | None = None  # per chunk: q [k, V] of its drafts


@dataclass
class BatchItem:
    """One sequence's rows in a forward: `token_ids` at positions start.. over its block
    table; the last `num_logits` rows are sampled (0, 1, or drafts + 1)."""

    request_id: str
    token_ids: list[int]
    start: int
    block_table: list[int]
    num_logits: int


def prepare_batch(
    chunks: list[ScheduledChunk], block_size: int, vocab_size: int, device: torch.device
) -> Batch:
    """Flatten the chunks (known tokens, then any draft tokens) into one varlen batch."""
    items = []
    for c in chunks:
        seq = c.seq
        assert 0 <= c.start < c.end <= seq.num_tokens, (
            f"{seq.request_id}: chunk [{c.start}, {c.end}) outside 0..{seq.num_tokens}"
        )
        assert not c.spec_token_ids or c.samples, f"{seq.request_id}: drafts on a prefill chunk"
        items.append(
            BatchItem(
                seq.request_id,
                seq.token_ids[c.start : c.end] + c.spec_token_ids,
                c.start,
                seq.block_table,
                len(c.spec_token_ids) + 1 if c.samples else 0,
            )
        )
    return prepare_items(items, block_size, vocab_size, device)


def prepare_items(
    items: list[BatchItem], block_size: int, vocab_size: int, device: torch.device
) -> Batch:
    """Token ids, positions, slot mapping, block tables and sample rows of the items."""
    bs = block_size
    input_ids: list[int] = []
    starts: list[int] = []
    qlens: list[int] = []
    seq_lens: list[int] = []
    tables: list[list[int]] = []
    sample_rows: list[tuple[int, int]] = []  # (item index, row), an item's rows consecutive
    for i, it in enumerate(items):
        start, end = it.start, it.start + len(it.token_ids)
        assert start < end and it.num_logits <= end - start
        needed = -(-end // bs)
        if len(it.block_table) < needed:
            raise EngineError(
                f"{it.request_id}: {len(it.block_table)} KV blocks for {end} tokens "
                f"(block size {bs}) — the scheduler must allocate before executing"
            )
        input_ids.extend(it.token_ids)
        starts.append(start)
        qlens.append(end - start)
        seq_lens.append(end)
        tables.append(it.block_table[:needed])
        last = len(input_ids)
        sample_rows.extend((i, row) for row in range(last - it.num_logits, last))
    decode_only = len(input_ids) == len(items)
    if not decode_only and not all(0 <= t < vocab_size or t == PLACEHOLDER for t in input_ids):
        bad = next(t for t in input_ids if not (0 <= t < vocab_size or t == PLACEHOLDER))
        raise EngineError(f"token id {bad} is outside the vocabulary (size {vocab_size})")
    max_blocks = max(len(t) for t in tables)
    padded = [t + [0] * (max_blocks - len(t)) for t in tables]
    block_tables = torch.tensor(padded, dtype=torch.int32)
    if decode_only:  # one row a sequence: its slot from the host lists (no tensor ops)
        pos = torch.tensor(starts, dtype=torch.int64)
        slot_list = [t[s // bs] * bs + s % bs for t, s in zip(tables, starts, strict=True)]
        slots = torch.tensor(slot_list, dtype=torch.int64)
        qsl = list(range(len(items) + 1))
    else:
        qlen_t = torch.tensor(qlens, dtype=torch.int64)
        seq_idx = torch.repeat_interleave(torch.arange(len(items)), qlen_t)
        first = torch.cumsum(qlen_t, 0) - qlen_t  # row of each chunk's first token
        pos = torch.arange(len(input_ids)) - first[seq_idx] + torch.tensor(starts)[seq_idx]
        slots = block_tables[seq_idx, pos // bs].to(torch.int64) * bs + pos % bs
        qsl = [0]
        for q in qlens:
            qsl.append(qsl[-1] + q)
    meta = AttentionMetadata(
        slot_mapping=to_device(slots, device),
        block_tables=to_device(block_tables, device),
        seq_lens=to_device(torch.tensor(seq_lens, dtype=torch.int32), device),
        query_start_loc=to_device(torch.tensor(qsl, dtype=torch.int32), device),
        decode_only=decode_only,
        max_query_len=max(qlens),
        max_seq_len=max(seq_lens),
    )
    ids = to_device(torch.tensor(input_ids, dtype=torch.int64), device)
    return Batch(ids, to_device(pos, device), max(seq_lens) - 1, meta, sample_rows)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor onto `device`: on CUDA through pinned memory with a non-blocking copy
    (the host goes on preparing while the copy runs; the caching host allocator keeps the
    pinned block alive until the copy is done), elsewhere a plain `.to`."""
    if torch.device(device).type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
