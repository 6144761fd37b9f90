"""The simulator's mixture-of-experts terms: where tokens are routed, and what the routed
experts of a step cost on a GPU roofline.

Routing (`ExpertRouting`): a request follows one routing *topic* (crc32 of its id modulo
`topics`); a topic's expert popularity is Zipf(`skew`) over the experts in a seeded order
(skew 0: uniform). Every token of a step draws its top-k distinct experts from its topic's
popularity (Gumbel top-k, seeded): a step's tokens per expert are counts, so a small batch
is as lumpy as a real router's, and an expert is active (its weights read) when it got any.
Without routing settings the cost model uses the uniform expectation (`uniform_load`).

Cost (`MoeCost`): each active expert runs its own gate/up/down GEMMs (a grouped GEMM), priced
by its own roofline: max(2 x expert params x its tokens / peak, its weight bytes / bw). With
expert parallelism (EP devices, E / EP contiguous experts each; attention and the dense
layers data-parallel: each device holds their weights and a KV pool, and computes 1 / EP of
the step's sequences, as in DP attention) a layer waits for its slowest device, so the
step's MoE time is, per sparse layer, max over devices of the sum over the device's experts. On one device imbalance costs only
where the hot expert's GEMM turns compute-bound; under EP the slowest device's share
(max share x EP) multiplies the layer's time. docs/moe.md has the numbers.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.model.config import ModelConfig


@dataclass(frozen=True)
class MoeSimSettings:
    skew: float = 0.0  # Zipf exponent of a topic's expert popularity (0: uniform)
    topics: int = 1  # routing topics; a request follows one (hash of its id)
    expert_parallel: int = 1  # devices the experts are spread over
    seed: int = 0


class ExpertRouting:
    """Sampled routing: each token's top-k experts drawn without replacement from its
    request's topic popularity (Gumbel top-k over log popularity), one seeded draw per step;
    per-request histograms of the last step are kept for the expert-balance scheduler."""

    def __init__(self, model_config: ModelConfig, settings: MoeSimSettings) -> None:
        assert model_config.is_moe
        if settings.skew < 0 or settings.topics < 1:
            raise EngineError(
                f"expert routing: skew must be >= 0 and topics >= 1, got {settings.skew}, "
                f"{settings.topics}"
            )
        self.num_experts = e = model_config.num_experts
        self.top_k = model_config.num_experts_per_tok
        self.settings = settings
        log_rank = -settings.skew * np.log(np.arange(1, e + 1, dtype=np.float64))
        self.topic_logits = np.empty((settings.topics, e))
        for t in range(settings.topics):
            order = np.random.default_rng([settings.seed, t]).permutation(e)
            self.topic_logits[t, order] = log_rank  # order[0]: the topic's favourite expert
        self._rng = np.random.default_rng([settings.seed, 1 << 20])
        self.last_histograms: dict[str, np.ndarray] = {}  # request id -> pairs per expert
        self.topic_load = np.zeros((settings.topics, e))  # pairs per expert seen, per topic
        self.total = np.zeros(e, dtype=np.int64)  # pairs per expert since the start

    def topic(self, request_id: str) -> int:
        return zlib.crc32(request_id.encode()) % self.settings.topics

    def predicted(self, request_id: str) -> list[float] | None:
        """A request's predicted routing: what its topic's tokens were routed to so far (a
        topic classifier's view; None before any of its topic ran)."""
        seen = self.topic_load[self.topic(request_id)]
        return seen.tolist() if seen.any() else None

    def step_load(self, items: Iterable[tuple[str, int]]) -> tuple[np.ndarray, np.ndarray]:
        """(tokens per expert, 1.0 where an expert got any) of a step whose chunks are
        (request id, tokens); `last_histograms` holds each request's own counts."""
        items = list(items)
        e, k = self.num_experts, self.top_k
        sizes = np.array([n for _, n in items], dtype=np.int64)
        topics = np.repeat([self.topic(rid) for rid, _ in items], sizes)
        noisy = self.topic_logits[topics] + self._rng.gumbel(size=(len(topics), e))
        chosen = np.argpartition(-noisy, k - 1, axis=1)[:, :k]  # [T, k] distinct experts
        rows = np.repeat(np.arange(len(items)), sizes)
        hist = np.bincount((rows[:, None] * e + chosen).ravel(), minlength=len(items) * e)
        hist = hist.reshape(len(items), e)
        self.last_histograms = {rid: hist[i] for i, (rid, _) in enumerate(items)}
        np.add.at(self.topic_load, [self.topic(rid) for rid, _ in items], hist)
        self.total += hist.sum(axis=0)
        tokens = hist.sum(axis=0).astype(np.float64)
        return tokens, (tokens > 0).astype(np.float64)


def uniform_load(num_experts: int, top_k: int, num_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """The same for uniform routing of `num_tokens` tokens."""
    p = top_k / num_experts
    tokens = np.full(num_experts, num_tokens * p)
    return tokens, np.full(num_experts, 1.0 - (1.0 - p) ** num_tokens)


class MoeCost:
    """The routed experts' share of a step (module docstring)."""

    def __init__(self, model_config: ModelConfig, dtype_bytes: int, expert_parallel: int = 1):
        mc = model_config
        assert mc.is_moe and mc.moe_intermediate_size is not None
        if expert_parallel < 1 or mc.num_experts % expert_parallel:
            raise EngineError(
                f"expert_parallel {expert_parallel} must divide the {mc.num_experts} experts"
            )
        self.num_experts = mc.num_experts
        self.top_k = mc.num_experts_per_tok
        self.expert_parallel = expert_parallel
        self.num_sparse_layers = len(mc.sparse_layers)
        self.expert_params = 3 * mc.hidden_size * mc.moe_intermediate_size  # one expert, one layer
        self.routed_params = self.num_sparse_layers * mc.num_experts * self.expert_params
        self.expert_bytes = self.expert_params * dtype_bytes

    def add_work(self, w, expert_load: tuple[np.ndarray, np.ndarray] | None) -> None:
        """Add the routed experts to a StepWork (cost_model.py): `expert_load` = (tokens per
        expert, P(active)) of one sparse layer, uniform routing of its tokens if None."""
        tokens, active = expert_load or uniform_load(self.num_experts, self.top_k, w.num_tokens)
        w.expert_load = (tokens, active)
        w.moe_flops = 2.0 * self.expert_params * float(tokens.sum()) * self.num_sparse_layers
        w.moe_bytes = self.expert_bytes * float(active.sum()) * self.num_sparse_layers
        w.flops += w.moe_flops
        w.bytes += w.moe_bytes

    def time(self, w, peak: float, bw: float) -> float:
        """Seconds of a StepWork's routed experts over all sparse layers: per device the sum
        of its experts' rooflines, the slowest device per layer."""
        if w.expert_load is None:
            return 0.0
        tokens, active = w.expert_load
        per_expert = np.maximum(
            2.0 * self.expert_params * tokens / peak, active * self.expert_bytes / bw
        )
        per_device = per_expert.reshape(self.expert_parallel, -1).sum(axis=1)
        return float(per_device.max()) * self.num_sparse_layers

    @staticmethod
    def max_share(tokens: np.ndarray) -> float:
        """The slowest (busiest) expert's share of the routed pairs (k / E when balanced)."""
        total = float(tokens.sum())
        return float(tokens.max()) / total if total else 0.0
