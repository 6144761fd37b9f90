"""A sparse mixture-of-experts block (Mixtral, Qwen2-MoE) over a flattened batch of tokens.

Routing: softmax over the router logits (in fp32), top-k experts per token, renormalised
when `norm_topk_prob` (Mixtral always). Computation is grouped by expert (vLLM's fused-MoE
layout without the fused kernel): the T x k (token, expert) pairs are sorted by expert, each
active expert runs ONE gate/up matmul and ONE down matmul over its contiguous rows, and the
weighted rows are added back to their tokens with one index_add. The Python loop is over
experts (at most E per layer), never over tokens.

Expert load telemetry: every forward adds its per-expert token counts (the bincount the
grouping needs anyway) into `expert_load`, an int64 buffer on the model's device; readers
copy it when they read stats, the forward never syncs for it. With `record_routing` on, the
block also keeps the step's top-k expert ids for per-sequence histograms (the expert-balance
scheduling option).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from cbbench.reference_engine.model.config import ModelConfig
from cbbench.reference_engine.model.llama import LlamaMLP
from torch import nn


class GateLinear(nn.Module):
    """A bias-free projection kept as a plain weight: the CPU linear optimisation swaps
    nn.Linear modules, and routers (E or 1 outputs) are too small to gain from it."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class FusedMoE(nn.Module):
    """The routed experts of one layer: `w13` [E, 2I, H] (gate rows, then up rows), `w2`
    [E, H, I], as vLLM lays them out; HF's per-expert tensors are row slices of them."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.intermediate_size = intermediate_size
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def forward(
        self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H], topk_* [T, k] -> (output [T, H], tokens per expert [E] int64)."""
        t, k = topk_ids.shape
        flat = topk_ids.reshape(-1)  # pair p = (token p // k, its (p % k)-th expert)
        counts = torch.bincount(flat, minlength=self.num_experts)
        order = torch.argsort(flat, stable=True)  # pairs grouped by expert, tokens in order
        rows = order // k
        xs = x[rows]
        inter = self.intermediate_size
        outs: list[torch.Tensor] = []
        sizes = counts.tolist()  # one host read: segment lengths
        assert sum(sizes) == t * k
        for e, seg in enumerate(xs.split(sizes)):
            if seg.shape[0] == 0:
                continue
            gate, up = F.linear(seg, self.w13[e]).split(inter, dim=-1)
            outs.append(F.linear(F.silu(gate) * up, self.w2[e]))
        if not outs:
            return torch.zeros_like(x), counts
        ys = torch.cat(outs) * topk_weights.reshape(-1)[order, None]
        out = torch.zeros_like(x).index_add_(0, rows, ys.to(x.dtype))
        return out, counts


class SparseMoeBlock(nn.Module):
    """Router + routed experts (+ Qwen2-MoE's shared expert behind its sigmoid gate)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        assert cfg.is_moe and cfg.moe_intermediate_size is not None
        self.num_experts = cfg.num_experts
        self.top_k = cfg.num_experts_per_tok
        self.norm_topk_prob = cfg.norm_topk_prob
        # Mixtral keeps the routing weights in fp32; Qwen2-MoE rounds them to the model dtype
        self.fp32_weights = cfg.architecture == "MixtralForCausalLM"
        self.gate = GateLinear(cfg.hidden_size, cfg.num_experts)
        self.experts = FusedMoE(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)
        self.shared_expert: LlamaMLP | None = None
        self.shared_expert_gate: GateLinear | None = None
        if cfg.shared_expert_intermediate_size:
            self.shared_expert = LlamaMLP(cfg, cfg.shared_expert_intermediate_size)
            self.shared_expert_gate = GateLinear(cfg.hidden_size, 1)
        self.register_buffer(
            "expert_load", torch.zeros(cfg.num_experts, dtype=torch.int64), persistent=False
        )
        self.record_routing = False
        self.last_topk_ids: torch.Tensor | None = None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k], expert ids [T, k]) of each token."""
        logits = self.gate(x)
        probs = torch.softmax(logits.float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return (weights if self.fp32_weights else weights.to(logits.dtype)), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        out, counts = self.experts(x, weights, ids)
        self.expert_load += counts
        if self.record_routing:
            self.last_topk_ids = ids
        if self.shared_expert is not None:
            assert self.shared_expert_gate is not None
            gate = torch.sigmoid(self.shared_expert_gate(x))
            out = out + gate * self.shared_expert(x)
        return out
