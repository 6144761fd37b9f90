"""LLMEngine: add requests, step (schedule -> execute -> update), read outputs and stats.

The same loop drives the real model (ModelRunner, wall clock) and the simulator
(SimExecutor, virtual clock); only the scheduler named in the config changes the policy.

Over 400 lines because the engine's few entry points (add, step, abort, reset the prefix
cache, describe) each need the loop's own state; splitting them would expose it.
"""

from __future__ import annotations

import time

from cbbench.reference_engine.config.engine_config import EngineConfig, kv_blocks_for_memory
from cbbench.reference_engine.core.block_manager import BlockManager
from cbbench.reference_engine.core.executor import Executor, ScheduledChunk
from cbbench.reference_engine.core.outputs import EngineStats, RequestMetrics, RequestOutput
from cbbench.reference_engine.core.sequence import Sequence, SequenceStatus
from cbbench.reference_engine.core.spec_decode_stats import SpecDecodeStats
from cbbench.reference_engine.engine.async_scheduling import AsyncPipeline
from cbbench.reference_engine.engine.disagg import KVTransferMixin
from cbbench.reference_engine.engine.update import StepUpdate
from cbbench.reference_engine.errors import EngineError, QueueFullError
from cbbench.reference_engine.execution.cost_model import CostModel, get_hardware
from cbbench.reference_engine.execution.warmup import WarmupReport, should_warm_up, warm_up
from cbbench.reference_engine.kv_transfer.payload import KVPayload
from cbbench.reference_engine.model.config import ModelConfig, resolve_model_config
from cbbench.reference_engine.sampling_params import SamplingParams
from cbbench.reference_engine.scheduler import make_scheduler
from cbbench.reference_engine.scheduler.expert_balance import ExpertBalancer
from cbbench.reference_engine.spec_decode import make_proposer

__all__ = ["LLMEngine", "QueueFullError", "resolve_model_config"]

CPU_KV_CACHE_MAX_GB = 1.0  # default KV pool cap on the CPU


def sim_num_kv_blocks(config: EngineConfig, cost: CostModel) -> int:
    """The simulated KV pool: --num-kv-blocks, else --kv-cache-memory-gb (GiB, as on the real
    path), else what the modelled device holds."""
    if config.num_kv_blocks:
        return config.num_kv_blocks
    if config.kv_cache_memory_gb:
        return kv_blocks_for_memory(
            config.kv_cache_memory_gb, cost.kv_bytes_per_token * config.block_size
        )
    return cost.kv_pool_blocks(config.block_size)


class LLMEngine(StepUpdate, KVTransferMixin):
    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        executor: Executor,
        num_kv_blocks: int,
        max_model_len: int,
    ) -> None:
        self.config = config
        self.model_config = model_config
        self.executor = executor
        self.max_model_len = max_model_len
        self.block_manager = BlockManager(
            num_kv_blocks, config.block_size, config.enable_prefix_caching
        )
        self.scheduler = make_scheduler(config, self.block_manager, max_model_len)
        self._check_capacity()
        self.seqs: dict[str, Sequence] = {}  # unfinished requests
        self._num_added = 0
        self.num_steps = 0
        self._last_chunks: list[ScheduledChunk] = []  # computed in the last step
        self._stats = EngineStats(0, 0, 0, 0, num_kv_blocks, 0, 0.0, 0, 0.0)
        spec = config.speculative
        self.proposer = make_proposer(config, executor, max_model_len)
        if hasattr(self.proposer, "max_drafts"):
            self.scheduler.draft_limit = self.proposer.max_drafts  # type: ignore[union-attr]
        if config.scheduler == "continuous" and config.continuous.expert_balance:
            self._attach_expert_balancer()
        self.spec_stats = SpecDecodeStats(spec.num_speculative_tokens) if spec.enabled else None
        self.last_step_window = (0.0, 0.0)  # engine-clock start/end of the last step's compute
        self._last_compute_end: float | None = None  # for the step gap
        self._pipeline = AsyncPipeline(self) if config.async_scheduling else None
        self._init_kv_transfer()
        self.warmup: WarmupReport | None = None  # from_config on CUDA (execution/warmup.py)
        if config.async_scheduling and hasattr(executor, "overlap_host"):
            executor.overlap_host = True  # the simulator: host work hides behind the device

    def _attach_expert_balancer(self) -> None:
        """continuous.expert_balance: the executor predicts each sequence's routing."""
        mc, ex = self.model_config, self.executor
        predict = getattr(ex, "expert_histogram", None)
        if not mc.is_moe or predict is None:
            raise EngineError(
                f"continuous.expert_balance needs a mixture-of-experts model ({mc.architecture} "
                f"is dense) on the real or simulated executor"
            )
        if hasattr(ex, "enable_expert_prediction"):
            ex.enable_expert_prediction()
        window = self.config.continuous.expert_balance_window
        self.scheduler.balancer = ExpertBalancer(predict, mc.num_experts, window)  # type: ignore[attr-defined]

    # --- construction -----------------------------------------------------------------
    @classmethod
    def from_config(cls, config: EngineConfig) -> LLMEngine:
        mc = resolve_model_config(config.model, shape_only=config.executor == "sim")
        max_model_len = config.max_model_len or mc.max_position_embeddings
        if max_model_len > mc.max_position_embeddings:
            raise EngineError(
                f"max_model_len {max_model_len} exceeds the model's max_position_embeddings "
                f"({mc.max_position_embeddings})"
            )
        dtype = mc.torch_dtype if config.dtype == "auto" else config.dtype
        if config.executor == "sim":
            from cbbench.reference_engine.execution.moe_cost import MoeSimSettings
            from cbbench.reference_engine.execution.sim_executor import SimExecutor

            moe = MoeSimSettings(config.sim_expert_skew, config.sim_expert_topics,
                                 config.expert_parallel, config.seed)  # fmt: skip
            cost = CostModel(mc, get_hardware(config.hardware), dtype, config.block_size, moe,
                             kv_cache_dtype=config.kv_cache_dtype,
                             tensor_parallel=config.tensor_parallel_size)  # fmt: skip
            num_blocks = sim_num_kv_blocks(config, cost)
            executor: Executor = SimExecutor(mc, cost, seed=config.seed, moe=moe)
        else:
            from cbbench.reference_engine.execution.model_runner import ModelRunner

            num_blocks = config.num_kv_blocks or cls._default_num_blocks(
                config, mc, dtype, max_model_len, ModelRunner.kv_bytes_per_block
            )
            executor = ModelRunner(
                config.model, num_kv_blocks=num_blocks, block_size=config.block_size,
                device=config.device, dtype=config.dtype, seed=config.seed,
                attention_backend=config.attention_backend, enforce_eager=config.enforce_eager,
                max_num_seqs=config.max_batch_slots, max_model_len=max_model_len,
                kv_cache_dtype=config.kv_cache_dtype, quantization=config.quantization,
            )  # fmt: skip
            mc = executor.model_config
        if num_blocks < 1:
            raise EngineError("the KV cache holds no block: raise kv_cache_memory_gb")
        engine = cls(config, mc, executor, num_blocks, max_model_len)
        if config.executor != "sim" and should_warm_up(executor):  # CUDA: Triton's JIT
            engine.warmup = warm_up(executor, max_model_len)
        return engine

    @staticmethod
    def _default_num_blocks(config, mc, dtype, max_model_len, bytes_per_block_fn) -> int:
        per_block = bytes_per_block_fn(mc, config.block_size, dtype, config.kv_cache_dtype)
        dtype_bytes = bytes_per_block_fn(mc, 1, dtype) // mc.kv_bytes_per_token(1)  # weights
        weights = mc.num_params() * dtype_bytes
        if config.speculative.method == "draft":  # its KV cache has as many blocks, same ids
            assert config.speculative.model is not None
            draft = resolve_model_config(config.speculative.model)
            per_block += draft.kv_bytes_per_token(dtype_bytes) * config.block_size
            weights += draft.num_params() * dtype_bytes
        if config.kv_cache_memory_gb:
            return kv_blocks_for_memory(config.kv_cache_memory_gb, per_block)
        if config.device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():  # a CPU build of torch, or no driver
                raise EngineError(
                    f"--device {config.device}: CUDA is not available to torch "
                    f"{torch.__version__} (a CPU build, or no NVIDIA driver); use --device cpu"
                )
            free, _ = torch.cuda.mem_get_info(torch.device(config.device))
            return max(1, int((free * 0.85 - weights) // per_block))
        # CPU: enough for every slot at full length, capped
        want = config.max_batch_slots * -(-max_model_len // config.block_size)
        return max(1, min(want, int(CPU_KV_CACHE_MAX_GB * 2**30 // per_block)))

    def _check_capacity(self) -> None:
        cfg, bm = self.config, self.block_manager
        if cfg.scheduler == "static":
            need = cfg.static.batch_size * bm.blocks_for(self.max_model_len)
            if need > bm.num_blocks:
                raise EngineError(
                    f"static batching reserves max_model_len ({self.max_model_len}) tokens per "
                    f"slot: batch_size {cfg.static.batch_size} needs {need} KV blocks but the "
                    f"pool has {bm.num_blocks}; lower the batch size or max_model_len, or give "
                    f"the KV cache more memory"
                )
        if (
            cfg.scheduler == "continuous"
            and not cfg.continuous.enable_chunked_prefill
            and cfg.continuous.max_num_batched_tokens < self.max_model_len
        ):
            raise EngineError(
                f"without chunked prefill, max_num_batched_tokens "
                f"({cfg.continuous.max_num_batched_tokens}) must be >= max_model_len "
                f"({self.max_model_len})"
            )

    # --- public API -------------------------------------------------------------------
    def describe(self) -> dict:
        """What this engine is, for start-up logs, `/v1/models` and run records."""
        return {
            "scheduler": self.config.scheduler,
            "role": self.config.role,
            "executor": self.config.executor,
            "device": str(getattr(self.executor, "device", self.config.device)),
            "dtype": self.config.dtype,
            "kv_cache_dtype": self.config.kv_cache_dtype,
            "quantization": self.config.quantization,
            "linear_impl": getattr(self.executor, "linear_impl", None),
            "hugepages": getattr(self.executor, "hugepages", None),  # CPU: weights, KV cache
            "attention_backend": getattr(self.executor, "attention_backend_name", None),
            "num_params": self.model_config.num_params(),
            "num_kv_blocks": self.block_manager.num_blocks,
            "block_size": self.config.block_size,
            "max_model_len": self.max_model_len,
            "enable_prefix_caching": self.config.enable_prefix_caching,
            "num_seqs_limit": self.scheduler.limit_stats()["num_seqs_limit"],
            "cpu_threads": self._cpu_threads(),
            **self.config.step_budget(),
        }

    def _cpu_threads(self) -> int | None:
        """torch's intra-op threads in this (the engine's) process: a real CPU engine's step
        time scales with them; None for the simulated executor, which has no threads to use."""
        if self.config.executor != "real":
            return None
        import torch

        return torch.get_num_threads()

    @property
    def scheduler_name(self) -> str:
        return self.scheduler.name

    def now(self) -> float:
        return self.executor.now()

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        arrival_time: float | None = None,
        *,
        kv_export: bool = False,
        kv_import: KVPayload | None = None,
    ) -> None:
        """`kv_export`: a prefill worker's request, its KV shipped when it finishes;
        `kv_import`: a decode worker's, starting from that payload (engine/disagg.py)."""
        self._check_kv_role(kv_export, kv_import)
        if request_id in self.seqs:
            raise EngineError(f"request {request_id!r}: id already in use")
        if not prompt_token_ids:
            raise EngineError(f"request {request_id!r}: empty prompt")
        if params.logprobs is not None and not getattr(self.executor, "supports_logprobs", False):
            raise EngineError(
                "logprobs need the real executor: the simulated one computes no logits"
            )
        vocab = self.model_config.vocab_size
        if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= vocab:
            raise EngineError(f"request {request_id!r}: prompt token ids must lie in [0, {vocab})")
        total = len(prompt_token_ids) + params.max_tokens
        if total > self.max_model_len:
            raise EngineError(
                f"request {request_id!r}: prompt ({len(prompt_token_ids)} tokens) + max_tokens "
                f"({params.max_tokens}) = {total} exceeds max_model_len ({self.max_model_len})"
            )
        bm = self.block_manager
        if bm.blocks_for(total) > bm.num_blocks:
            raise EngineError(
                f"request {request_id!r}: {total} tokens need {bm.blocks_for(total)} KV blocks "
                f"but the pool has {bm.num_blocks}"
            )
        limit = self.config.max_waiting
        if self.config.scheduler == "dynamic" and self.config.dynamic.max_queue_size:
            limit = min(limit or 1 << 62, self.config.dynamic.max_queue_size)
        if limit is not None and self.scheduler.num_waiting >= limit:
            raise QueueFullError(
                f"request {request_id!r}: the waiting queue is full ({limit} requests)"
            )
        seq = Sequence(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            sampling_params=params,
            metrics=RequestMetrics(
                arrival_time=self.now() if arrival_time is None else arrival_time
            ),
            priority=priority,
            seq_index=self._num_added,
            stop_token_ids=frozenset(params.stop_token_ids).union(
                () if params.ignore_eos else self.model_config.eos_token_ids
            ),
            max_num_tokens=min(total, self.max_model_len),
            kv_export=kv_export,
        )
        self._num_added += 1
        self.seqs[request_id] = seq
        if kv_import is not None:
            try:
                if self._start_imported(seq, kv_import):
                    return  # its first token ended it
            except EngineError:
                del self.seqs[request_id]
                raise
        self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> None:
        """Finish a request in any state ("abort") and free its KV blocks now. Unknown or
        already finished ids are ignored (a client may disconnect after the end)."""
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = "abort"
        self._forget_import(seq)
        self.scheduler.abort(seq)
        seq.metrics.finished_time = self.now()

    def reset_prefix_cache(self) -> int:
        """Drop the prefix cache (POST /reset_prefix_cache); how many blocks it held."""
        return self.block_manager.reset_prefix_cache()

    def close_input(self) -> None:
        """No request will be added any more: a policy waiting for a batch to fill runs what
        waits instead (static batching's drain timeout cannot be ended by an arrival)."""
        self.scheduler.input_closed = True

    def has_unfinished_requests(self) -> bool:
        return bool(self.seqs) or bool(self._pending_outputs)

    def next_wakeup(self) -> float | None:
        return self.scheduler.next_wakeup(self.now())

    def step(self) -> list[RequestOutput]:
        """One step: schedule, compute, apply; returns the outputs it produced. With
        async_scheduling they are the outputs of the step that just finished computing,
        while the next one already computes (async_scheduling.py). Outputs made since the
        last step (a decode worker's imported first tokens) come first."""
        pending = self._take_pending() if self._pending_outputs else None
        if self._pipeline is not None and self._pipeline.usable():
            outputs = self._pipeline.step()
        else:
            outputs = self._step()
        if self._kv_exports:
            self._attach_exports(outputs)
        return pending + outputs if pending else outputs

    def _step(self) -> list[RequestOutput]:
        now = self.now()
        t0 = time.perf_counter()
        out = self.scheduler.schedule(now)
        chunks = self._last_chunks = out.chunks
        if not chunks:
            self._idle_since_step()
            return []
        if self._num_importing:
            self._load_imports(chunks)
        sched_s = time.perf_counter() - t0  # host scheduling only, not the draft's forwards
        start = self.now()  # the device's work starts here: draft forwards, then the verify
        num_tokens = out.num_batched_tokens  # = query rows, unless lookahead slots went unused
        if self.proposer is not None and any(c.num_lookahead for c in chunks):
            self.proposer.propose(chunks)
            for c in chunks:
                assert len(c.spec_token_ids) <= c.num_lookahead
            num_tokens = sum(c.num_scheduled_tokens for c in chunks)
        tokens = self.executor.execute(chunks)
        logprobs = getattr(self.executor, "last_logprobs", None)
        end = self.now()
        self.num_steps += 1
        outputs = self._apply(chunks, tokens, end)
        if logprobs:
            for output in outputs:
                if output.request_id in logprobs:
                    output.logprobs = logprobs[output.request_id][: len(output.new_token_ids)]
        pooled = getattr(self.executor, "last_embeddings", None)
        for output in outputs if pooled else ():
            output.embedding = pooled.get(output.request_id)
        self.last_step_window = (start, end)
        self._update_stats(len(chunks), num_tokens, end - now, sched_s, self._gap(start))
        self._last_compute_end = end if self.seqs else None
        return outputs

    @property
    def last_scheduled(self) -> list[str]:
        """Request ids computed in the last step."""
        return [c.seq.request_id for c in self._last_chunks]

    def _gap(self, start: float) -> float | None:
        """Executor idle time before a step that starts at `start` (None after idling)."""
        last = self._last_compute_end
        if last is None:
            return None
        modeled = getattr(self.executor, "modeled_gap_s", None)  # the simulator's
        return modeled if modeled is not None else max(0.0, start - last)

    def _idle_since_step(self) -> None:
        """Nothing computed this step: the next gap is not an executor stall."""
        self._last_compute_end = None
        self._update_stats(0, 0, 0.0)

    # --- stats ------------------------------------------------------------------------
    def _update_stats(
        self,
        num_seqs: int,
        num_tokens: int,
        step_time: float,
        scheduler_time: float = 0.0,
        step_gap: float | None = None,
    ) -> None:
        bm = self.block_manager
        self._stats = EngineStats(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            num_preempted_total=self.scheduler.num_preemptions,
            kv_blocks_used=bm.num_used_blocks,
            kv_blocks_total=bm.num_blocks,
            kv_reserved_unused_tokens=self.scheduler.reserved_unused_tokens(),
            batch_occupancy=num_seqs / self.config.max_batch_slots,
            num_batched_tokens=num_tokens,
            step_time_s=step_time,
            spec_decode=self.spec_stats.snapshot() if self.spec_stats is not None else None,
            scheduler_time_s=scheduler_time,
            step_gap_s=step_gap,
            num_steps=self.num_steps,
            **self.scheduler.limit_stats(),
        )

    def get_stats(self) -> EngineStats:
        """Stats as of the end of the last step (queue counts are current)."""
        s = self._stats
        s.num_waiting = self.scheduler.num_waiting
        s.num_running = self.scheduler.num_running
        s.kv_blocks_used = self.block_manager.num_used_blocks
        expert_load = getattr(self.executor, "expert_load", None)  # MoE models (ModelRunner)
        s.expert_load = expert_load() if expert_load is not None else None
        return s

    def check_invariants(self) -> None:
        """Asserts on the whole engine state (tests call it after every step)."""
        holders = self.scheduler.holders()
        self.block_manager.check_invariants(holders)
        for seq in self.scheduler.waiting:
            assert not seq.block_table, f"waiting {seq.request_id} holds KV blocks"
            assert seq.num_computed_tokens == 0
        for seq in self.scheduler.running():
            assert seq.request_id in self.seqs
            assert seq.num_computed_tokens <= len(seq.block_table) * self.block_manager.block_size
        assert self.scheduler.num_running == len(self.scheduler.running())
        assert self.scheduler.num_running <= self.config.max_batch_slots
        bm = self.block_manager
        unused = sum(  # the stat's shortcut (no per-block walk) against its definition
            len(s.block_table) * bm.block_size - (0 if s.is_finished else s.num_computed_tokens)
            for s in holders
        )
        assert self.scheduler.reserved_unused_tokens() == unused
        for seq in self.scheduler.running():
            for i, bid in enumerate(seq.block_table):  # cached blocks hold kept tokens only
                b = bm.blocks[bid]
                if b.block_hash is not None:
                    assert b.token_ids == tuple(seq.token_ids[i * bm.block_size :][: bm.block_size])
            if self.config.speculative.enabled:  # rolled back: no lookahead block left over
                assert len(seq.block_table) <= bm.blocks_for(seq.num_tokens), seq.request_id
                assert seq.num_draft_computed <= seq.num_computed_tokens, seq.request_id
