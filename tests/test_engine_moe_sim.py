"""The simulator's MoE terms: routed experts priced per active expert on the roofline, sampled
routing whose skew concentrates tokens, expert parallelism waiting for the slowest device,
and the settings' errors."""

from __future__ import annotations

import numpy as np
import pytest
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.cost_model import CostModel, get_hardware
from cbbench.reference_engine.execution.moe_cost import ExpertRouting, MoeSimSettings
from cbbench.reference_engine.model.config import preset_config
from cbbench.reference_engine.sampling_params import SamplingParams

MIXTRAL = preset_config("mixtral-8x7b")
H200 = get_hardware("h200")


def decode(batch: int, ctx: int = 1000) -> list[tuple[int, int, bool]]:
    return [(ctx, 1, True)] * batch


def test_decode_reads_only_the_active_experts():
    cm = CostModel(MIXTRAL, H200, "bfloat16")
    assert cm.moe is not None and cm.moe.routed_params == 32 * 8 * 3 * 4096 * 14336
    one, many = cm.work(decode(1)), cm.work(decode(256))
    expert_bytes = 3 * 4096 * 14336 * 2 * 32  # one expert in every layer
    # batch 1: top-2 experts read; batch 256: all 8 (uniform expectation)
    assert one.moe_bytes == pytest.approx(2 * expert_bytes)
    assert many.moe_bytes == pytest.approx(8 * expert_bytes, rel=1e-6)
    assert one.bytes - one.kv_bytes == pytest.approx(cm.step_weight_bytes + 2 * expert_bytes)
    # active parameters per token: 12.9B of 46.7B
    flops_per_token = (one.flops - one.attn_flops - cm.head_flops) / 2
    assert flops_per_token == pytest.approx(MIXTRAL.num_params(active=True) - 2 * 32000 * 4096)
    assert cm.time_of(many) > cm.time_of(one)


def test_skewed_routing_concentrates_tokens():
    shares = {}
    for skew in (0.0, 2.0):
        r = ExpertRouting(MIXTRAL, MoeSimSettings(skew=skew, seed=1))
        tokens, active = r.step_load([(f"r{i}", 4) for i in range(64)])
        assert tokens.sum() == 64 * 4 * 2  # every token to k = 2 distinct experts
        assert set(np.unique(active)) <= {0.0, 1.0}
        assert all(h.sum() == 8 and h.max() <= 4 for h in r.last_histograms.values())
        shares[skew] = tokens.max() / tokens.sum()
    assert shares[0.0] < 0.2 < 0.35 < shares[2.0]


def test_topics_give_requests_different_favourite_experts():
    r = ExpertRouting(MIXTRAL, MoeSimSettings(skew=3.0, topics=4, seed=0))
    favourites = {int(np.argmax(r.topic_logits[t])) for t in range(4)}
    assert len(favourites) > 1
    same = [f"q{i}" for i in range(200) if r.topic(f"q{i}") == 0][:16]
    mixed = [f"q{i}" for i in range(16)]
    load_same, _ = r.step_load([(rid, 32) for rid in same])
    load_mixed, _ = r.step_load([(rid, 32) for rid in mixed])
    assert load_same.max() / load_same.sum() > load_mixed.max() / load_mixed.sum()


def test_expert_parallel_waits_for_the_slowest_device():
    cm = CostModel(MIXTRAL, H200, "bfloat16", moe=MoeSimSettings(expert_parallel=8))
    chunks = [(0, 512, True)] * 4  # 2048 prefill tokens: the experts are compute-bound
    balanced = (np.full(8, 2048 * 2 / 8), np.ones(8))
    hot = (
        np.array([2048, 2048, 0, 0, 0, 0, 0, 0], dtype=float),
        np.array([1.0, 1, 0, 0, 0, 0, 0, 0]),
    )
    t_bal, t_hot = cm.time_of(cm.work(chunks, balanced)), cm.time_of(cm.work(chunks, hot))
    assert t_hot > 1.5 * t_bal
    one = CostModel(MIXTRAL, H200, "bfloat16")  # one device: the total work is what counts
    ratio = one.time_of(one.work(chunks, hot)) / one.time_of(one.work(chunks, balanced))
    assert ratio < 1.05
    assert cm.kv_pool_blocks(16) > 8 * (one.kv_pool_blocks(16) - 1)  # a KV pool per device


def test_sim_engine_runs_mixtral_with_skewed_routing():
    def tpot(skew: float) -> float:
        cfg = EngineConfig(
            model="mixtral-8x7b", dtype="bfloat16", executor="sim", hardware="h200",
            sim_expert_skew=skew, expert_parallel=8,
        )  # fmt: skip
        cfg.continuous.max_num_seqs = 256
        engine = LLMEngine.from_config(cfg)
        for i in range(256):
            engine.add_request(f"r{i}", list(range(1, 9)), SamplingParams(max_tokens=16))
        steps = []
        while engine.has_unfinished_requests():
            engine.step()
            steps.append(engine.get_stats().step_time_s)
        load = engine.get_stats().expert_load  # the simulated routing, as /metrics shows it
        assert load is not None and len(load) == 32
        assert sum(load[0]) == 2 * 256 * (8 + 16 - 1) and load[0] == load[31]
        return float(np.median(steps[1:]))

    # 256 decodes on 8 devices: the hot expert's 250-odd tokens make its GEMM compute-bound
    assert tpot(3.0) > 1.05 * tpot(0.0)


def test_moe_sim_settings_errors_name_the_field():
    with pytest.raises(EngineError, match="sim_expert_skew"):
        EngineConfig(sim_expert_skew=-1.0)
    with pytest.raises(EngineError, match="expert_parallel"):
        EngineConfig(expert_parallel=0)
    with pytest.raises(EngineError, match="must divide the 8 experts"):
        LLMEngine.from_config(
            EngineConfig(model="mixtral-8x7b", executor="sim", hardware="h200", expert_parallel=3)
        )
