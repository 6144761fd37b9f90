"""Speculative decoding: proposers (n-gram lookup, draft model, simulated) that fill each
decoding chunk's lookahead with draft tokens; the target verifies them in its one forward per
step (execution/rejection_sampler.py). See docs/speculative-decoding.md.

Layer: speculative decoding (proposers).
Imports: config, core, execution, model.
"""

from __future__ import annotations

from typing import Protocol

from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.core.executor import ScheduledChunk


class Proposer(Protocol):
    def propose(self, chunks: list[ScheduledChunk]) -> None:
        """Set `spec_token_ids` (at most `num_lookahead` tokens) on chunks that have
        lookahead slots."""
        ...


def make_proposer(config: EngineConfig, executor, max_model_len: int) -> Proposer | None:
    spec = config.speculative
    if not spec.enabled:
        return None
    from cbbench.reference_engine.execution.sim_executor import SimExecutor

    if isinstance(executor, SimExecutor):
        from cbbench.reference_engine.spec_decode.proposer_sim import SimProposer

        draft_cost = None
        if spec.method == "draft":
            from cbbench.reference_engine.execution.cost_model import CostModel, get_hardware
            from cbbench.reference_engine.model.config import resolve_model_config

            assert spec.model is not None
            mc = resolve_model_config(spec.model)
            dtype = mc.torch_dtype if config.dtype == "auto" else config.dtype
            draft_cost = CostModel(mc, get_hardware(config.hardware), dtype,
                                   tensor_parallel=config.tensor_parallel_size)  # fmt: skip
        return SimProposer(executor, spec.acceptance_rate, draft_cost, config.seed)
    if spec.method == "ngram":
        from cbbench.reference_engine.spec_decode.proposer_ngram import NgramProposer

        return NgramProposer(spec.ngram_min, spec.ngram_max)
    from cbbench.reference_engine.execution.model_runner import ModelRunner
    from cbbench.reference_engine.spec_decode.proposer_draft import DraftModelProposer

    assert spec.model is not None and isinstance(executor, ModelRunner)
    return DraftModelProposer(spec.model, executor, max_model_len, config.seed)
