"""The simulated executor: no model, a virtual clock advanced by the cost model's step time,
and deterministic pseudo tokens, a function of (seed, request id, position) only, so the same
request yields the same tokens whatever the batch, the scheduler or a preemption."""

from __future__ import annotations

import zlib
from collections.abc import Callable

from cbbench.reference_engine.core.executor import ScheduledChunk
from cbbench.reference_engine.execution.cost_model import CostModel
from cbbench.reference_engine.execution.kv_import import import_rate, import_time_s
from cbbench.reference_engine.execution.moe_cost import ExpertRouting, MoeSimSettings
from cbbench.reference_engine.execution.step_jitter import StepJitter
from cbbench.reference_engine.model.config import ModelConfig

# (request id, start, known tokens, draft tokens, samples, block table or None): one chunk,
# as the step saw it (the table only when the cost model prices the KV layout)
_Item = tuple[str, int, int, list[int], bool, list[int] | None]


class SimExecutor:
    def __init__(
        self,
        model_config: ModelConfig,
        cost_model: CostModel,
        seed: int = 0,
        eos_probability: float = 0.0,
        moe: MoeSimSettings | None = None,
    ) -> None:
        assert 0.0 <= eos_probability <= 1.0
        # MoE models: each request's expected routing (moe_cost.py), priced per step
        self.routing = (
            ExpertRouting(model_config, moe or MoeSimSettings()) if model_config.is_moe else None
        )
        self.model_config = model_config
        self.cost_model = cost_model
        self.seed = seed
        self.eos_probability = eos_probability
        self.eos_ids = model_config.eos_token_ids
        self.clock = 0.0
        self.last_step_time = 0.0
        self._draft_time = 0.0  # speculative: draft-model time of this step (SimProposer)
        self._import_time = 0.0  # P/D decode: KV copy-in of requests this step admits
        self._import_rate = import_rate(cost_model.hardware)[0]
        self.modeled_gap_s = 0.0  # device idle before the last step (the clock can't show it)
        # the host's contention over time (co-located CPU workers: on a core + queued for one,
        # over on a core), a step starting at t taking slowdown(t) times as long; None: 1
        self.slowdown: Callable[[float], float] | None = None
        # a from-run fit's step jitter (step_jitter.py): each step's time times a draw
        self.jitter = StepJitter.of(cost_model.hardware, seed)

    def now(self) -> float:
        return self.clock

    def advance_to(self, t: float) -> None:
        """Idle until virtual time t (never backwards)."""
        self.clock = max(self.clock, t)

    def expert_load(self) -> list[list[int]] | None:
        """MoE models: simulated tokens per expert since the start, per layer (one routing
        draw per step serves every sparse layer); None for dense models."""
        if self.routing is None:
            return None
        row = self.routing.total.tolist()
        mc = self.model_config
        return [list(row) if mc.is_sparse_layer(i) else [] for i in range(mc.num_hidden_layers)]

    def expert_histogram(self, seq) -> list[float] | None:
        """MoE models, the expert-balance scheduler: the request's predicted routing."""
        return self.routing.predicted(seq.request_id) if self.routing is not None else None

    def token_for(self, request_id: str, position: int) -> int:
        """The token a request gets at `position` of its token ids: EOS with probability
        `eos_probability`, otherwise a pseudo-random non-EOS id."""
        h = zlib.crc32(f"{self.seed}:{request_id}:{position}".encode())
        if self.eos_ids and self.eos_probability and (h >> 8) / (1 << 24) < self.eos_probability:
            return self.eos_ids[0]
        vocab = self.model_config.vocab_size
        tok = zlib.crc32(f"t{h}".encode()) % vocab
        while tok in self.eos_ids:
            tok = (tok + 1) % vocab
        return tok

    def add_draft_time(self, seconds: float) -> None:
        """Charge the draft model's steps to the next execute()."""
        self._draft_time += seconds

    def add_import(self, num_tokens: int) -> None:
        """Charge an imported request's KV copy-in (its prompt's whole blocks) to the next
        step, on this worker's loop (execution/kv_import.py)."""
        bs = self.cost_model.block_size
        nbytes = -(-num_tokens // bs) * bs * self.cost_model.kv_bytes_per_token
        self._import_time += import_time_s(nbytes, self._import_rate)

    def execute(self, chunks: list[ScheduledChunk]) -> list[list[int]]:
        return self.run(self.prepare(chunks))

    # --- async scheduling: the same, split; run inline (virtual time) --------------------
    runs_in_thread = False
    overlap_host = False  # async scheduling: host work hides behind device time

    def prepare(self, chunks: list[ScheduledChunk]) -> list[_Item]:
        """A snapshot of the chunks (plain tuples: this runs for every simulated step)."""
        if self.cost_model.uses_layout:  # a calibrated CPU fit prices decode's KV layout
            return [
                (c.seq.request_id, c.start, c.num_tokens, c.spec_token_ids, c.samples,
                 c.seq.block_table)
                for c in chunks
            ]  # fmt: skip
        return [
            (c.seq.request_id, c.start, c.num_tokens, c.spec_token_ids, c.samples, None)
            for c in chunks
        ]

    def patch(self, step: object, rows: list[int], tokens: list[int]) -> None:
        pass  # pseudo tokens depend on (request, position) only

    def run(self, step: list[_Item]) -> list[list[int]]:
        load = None
        if self.routing is not None:
            load = self.routing.step_load((rid, n + len(spec)) for rid, _, n, spec, _, _ in step)
        work = self.cost_model.work(
            ((start, n + len(spec), s, table) for _, start, n, spec, s, table in step), load
        )
        # speculative verify: the LM head runs on every draft row too, not just the last
        drafts = sum(len(spec) for _, _, _, spec, s, _ in step if s)
        if drafts:
            work.num_samples += drafts
            work.flops += self.cost_model.head_flops * drafts
        device, host = self.cost_model.split_time(work)
        verify = self.cost_model.time_of(work, overlap_host=self.overlap_host)
        # the device waits while the host builds the step, unless that overlaps (async)
        self.modeled_gap_s = max(0.0, host - device) if self.overlap_host else host
        self.last_step_time = self._draft_time + verify
        if self.slowdown is not None:
            self.last_step_time *= self.slowdown(self.clock)
        if self.jitter is not None:
            self.last_step_time *= self.jitter.draw()
        # the import runs on the loop before the forward; the host's contention slows it too
        self.last_step_time += self._import_time * (self.slowdown(self.clock) if self.slowdown else 1.0)
        self._draft_time = self._import_time = 0.0
        self.clock += self.last_step_time
        return [
            self._tokens(rid, start + n, spec) if s else [] for rid, start, n, spec, s, _ in step
        ]

    def _tokens(self, rid: str, end: int, spec: list[int]) -> list[int]:
        """The request's own tokens from `end` on: drafts while they match, then one more."""
        out: list[int] = []
        for j, d in enumerate(spec):
            out.append(self.token_for(rid, end + j))
            if out[-1] != d:
                return out
        out.append(self.token_for(rid, end + len(spec)))
        return out
