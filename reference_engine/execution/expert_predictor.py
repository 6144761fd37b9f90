"""Predicted expert routing of requests on the real model, for the expert-balance scheduler.

With prediction on, every sparse layer keeps its step's top-k ids (`record_routing`) and,
after each forward, `observe` turns them into
- each chunk's histogram (pairs per expert, summed over the sparse layers): a running
  request's prediction is its previous step's;
- a per-token-id table [vocab, E] of where that token id's occurrences were routed, learned
  online from every step: a waiting request's prediction is the sum of its prompt tokens'
  rows (None while none of them was seen).
Cost per step: one bincount per layer for the chunks, one one-hot scatter per layer and one
index_add into the table, and one device-to-host copy of the [chunks, E] histograms.
"""

from __future__ import annotations

import torch
from cbbench.reference_engine.model.mixtral import MoeForCausalLM


class ExpertPredictor:
    def __init__(self, model: MoeForCausalLM) -> None:
        cfg = model.config
        self.model = model
        self.num_experts = cfg.num_experts
        device = model.model.embed_tokens.weight.device
        self.token_table = torch.zeros(cfg.vocab_size, cfg.num_experts, device=device)
        self.last: dict[str, list[int]] = {}  # request id -> its chunk's pairs per expert
        model.set_record_routing(True)

    def observe(self, input_ids: torch.Tensor, query_start_loc: torch.Tensor, ids: list[str]):
        """After a forward over the chunks of `ids` (rows delimited by query_start_loc)."""
        qsl = query_start_loc.to(torch.int64)
        rows = torch.repeat_interleave(torch.arange(len(ids), device=qsl.device), qsl.diff())
        hist = self.model.routing_histograms(rows.to(input_ids.device), len(ids))
        self.last = dict(zip(ids, hist.tolist(), strict=True))
        known = input_ids >= 0  # async scheduling's placeholders are not tokens yet
        per_token = torch.zeros(input_ids.shape[0], self.num_experts, device=input_ids.device)
        for block in self.model.moe_blocks():
            assert block.last_topk_ids is not None
            per_token.scatter_add_(
                1, block.last_topk_ids, torch.ones_like(block.last_topk_ids, dtype=per_token.dtype)
            )
        self.token_table.index_add_(0, input_ids[known], per_token[known])

    def histogram(self, request_id: str, prompt_token_ids: list[int]) -> list[float] | None:
        if request_id in self.last:
            return [float(v) for v in self.last[request_id]]
        ids = torch.tensor(prompt_token_ids, dtype=torch.int64, device=self.token_table.device)
        pred = self.token_table[ids].sum(dim=0)
        return pred.tolist() if bool(pred.any()) else None
