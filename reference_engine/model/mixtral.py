"""Mixture-of-experts decoders: Mixtral (`MixtralForCausalLM`) and Qwen2-MoE
(`Qwen2MoeForCausalLM`). Attention, norms and the varlen forward are the Llama family's
(llama.py); the MLP of each sparse layer is a SparseMoeBlock (moe.py), Qwen2-MoE's dense
layers (`mlp_only_layers`, `decoder_sparse_step`) keep a plain MLP.

Checkpoint names are transformers': Mixtral `block_sparse_moe.gate` and
`block_sparse_moe.experts.{e}.w1/w2/w3` (gate, down, up); Qwen2-MoE `mlp.gate`,
`mlp.experts.{e}.gate_proj/up_proj/down_proj`, `mlp.shared_expert.*` and
`mlp.shared_expert_gate`. Each per-expert tensor is a row slice of one expert's plane of the
fused [E, ...] parameters.
"""

from __future__ import annotations

import torch
from cbbench.reference_engine.model.config import ModelConfig
from cbbench.reference_engine.model.llama import LlamaForCausalLM, dense_mlp_slices
from cbbench.reference_engine.model.moe import SparseMoeBlock
from torch import nn

Slices = dict[str, tuple[torch.Tensor, int, int]]


class MoeForCausalLM(LlamaForCausalLM):
    """A Llama-family decoder whose sparse layers route each token to top-k experts."""

    def __init__(self, cfg: ModelConfig) -> None:
        assert cfg.is_moe, f"{cfg.architecture}: not a mixture-of-experts config"
        super().__init__(cfg)
        for i in cfg.sparse_layers:
            self.model.layers[i].mlp = SparseMoeBlock(cfg)

    def init_rope(self, device: str | torch.device) -> None:
        super().init_rope(device)
        self.reset_expert_load()  # the buffers' first values on the final device

    # --- expert load ---------------------------------------------------------------------
    def moe_blocks(self) -> list[SparseMoeBlock]:
        """The sparse layers' blocks, in layer order (`config.sparse_layers`)."""
        return [
            m for m in (layer.mlp for layer in self.model.layers) if isinstance(m, SparseMoeBlock)
        ]

    def reset_expert_load(self) -> None:
        for b in self.moe_blocks():
            b.expert_load.zero_()

    def expert_load(self) -> torch.Tensor:
        """Tokens routed to each expert since the start: [sparse layers, E] int64 on the CPU
        (one device-to-host copy)."""
        return torch.stack([b.expert_load for b in self.moe_blocks()]).cpu()

    def set_record_routing(self, on: bool) -> None:
        for b in self.moe_blocks():
            b.record_routing = on
            b.last_topk_ids = None

    def routing_histograms(self, token_rows: torch.Tensor, num_rows: int) -> torch.Tensor:
        """Per-row expert histograms of the last forward (needs `set_record_routing(True)`):
        `token_rows` [T] gives each token's row (e.g. its chunk); returns [num_rows, E]
        int64, pairs summed over the sparse layers. One bincount per layer."""
        e = self.config.num_experts
        out = torch.zeros(num_rows * e, dtype=torch.int64, device=token_rows.device)
        for b in self.moe_blocks():
            assert b.last_topk_ids is not None, "record_routing is off or no forward ran"
            ids = b.last_topk_ids
            keys = (token_rows[:, None] * e + ids).reshape(-1)
            out += torch.bincount(keys, minlength=num_rows * e)
        return out.view(num_rows, e)

    # --- checkpoint names ----------------------------------------------------------------
    def mlp_weight_slices(self, pre: str, mlp: nn.Module) -> Slices:
        if not isinstance(mlp, SparseMoeBlock):
            return dense_mlp_slices(pre + "mlp.", mlp)
        mixtral = self.config.architecture == "MixtralForCausalLM"
        pre += "block_sparse_moe." if mixtral else "mlp."
        ex = mlp.experts
        inter = ex.intermediate_size
        out: Slices = {pre + "gate.weight": (mlp.gate.weight, 0, mlp.num_experts)}
        gate, up, down = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
        for e in range(mlp.num_experts):
            w13, w2 = ex.w13[e], ex.w2[e]  # views: copying into them fills the parameter
            name = f"{pre}experts.{e}."
            out[name + f"{gate}.weight"] = (w13, 0, inter)
            out[name + f"{up}.weight"] = (w13, inter, 2 * inter)
            out[name + f"{down}.weight"] = (w2, 0, w2.shape[0])
        if mlp.shared_expert is not None:
            assert mlp.shared_expert_gate is not None
            out.update(dense_mlp_slices(pre + "shared_expert.", mlp.shared_expert))
            out[pre + "shared_expert_gate.weight"] = (mlp.shared_expert_gate.weight, 0, 1)
        return out


def model_class(cfg: ModelConfig) -> type[LlamaForCausalLM]:
    """The module class for a config: MoeForCausalLM for MoE architectures."""
    return MoeForCausalLM if cfg.is_moe else LlamaForCausalLM
