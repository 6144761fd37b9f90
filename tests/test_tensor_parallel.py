"""Tensor parallelism in the simulator: weights and KV heads sharded over a replica's GPUs,
all-reduces priced from the link, the skipping path equal to the stepping one, `sim` and
`plan` (which picks the fewest GPUs a model fits), and the presets and HF configs it needs."""

from __future__ import annotations

import json

import pytest
from cbbench.harness.cli import main
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.cost_model import (
    CostModel,
    get_hardware,
    min_tensor_parallel,
)
from cbbench.reference_engine.model.config import preset_config, resolve_model_config
from cbbench.reference_engine.sim.simulate import simulate

from tests.test_event_skip import assert_same, cfg, workload


def test_sharding_and_all_reduce_priced():
    mc, hw = preset_config("llama-3.1-8b"), get_hardware("h100")
    one, two = (CostModel(mc, hw, "bfloat16", tensor_parallel=t) for t in (1, 2))
    decode = [(500, 1, True)] * 32
    w1, w2 = one.work(decode), two.work(decode)
    overhead = hw.step_overhead_s + hw.per_seq_overhead_s * 32
    # the device's part halves, and two all-reduces a layer come on top
    assert two.time_of(w2) == pytest.approx(
        (one.time_of(w1) - overhead) / 2 + two.allreduce_s(32) + overhead)
    assert one.allreduce_s(32) == 0.0 < two.allreduce_s(32)
    pcie = CostModel(mc, get_hardware("l40s"), "bfloat16", tensor_parallel=2)
    assert pcie.allreduce_s(2048) > 5 * two.allreduce_s(2048)  # PCIe against NVLink
    # the weights split: twice the GPUs hold more than twice the KV cache
    assert two.kv_pool_blocks(16) > 2 * one.kv_pool_blocks(16)


def test_a_model_that_does_not_fit_one_gpu_says_raise_tp():
    mc, hw = preset_config("llama-3.1-70b"), get_hardware("h100")
    with pytest.raises(EngineError, match="raise --tensor-parallel-size"):
        CostModel(mc, hw, "bfloat16").kv_pool_blocks(16)
    assert min_tensor_parallel(mc, hw, "bfloat16") == 4
    assert min_tensor_parallel(preset_config("llama-3.1-8b"), hw, "bfloat16") == 1
    with pytest.raises(EngineError, match="does not divide"):
        CostModel(mc, hw, "bfloat16", tensor_parallel=3)
    with pytest.raises(EngineError, match="simulator's only"):
        EngineConfig(model="tiny", executor="real", tensor_parallel_size=2)


def test_skipping_equals_stepping_with_tensor_parallel():
    c = cfg("continuous", model="llama-3-8b", hardware="l40s", tensor_parallel_size=2)
    reqs = workload(3)
    stepped, skipped = simulate(reqs, c), simulate(reqs, c, event_skip=True)
    assert skipped.skipped_steps > 0.2 * len(skipped.steps)
    assert_same(stepped, skipped)


def test_hf_config_of_any_dense_model_for_the_simulator(tmp_path):
    cfg_json = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936,
                "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64,
                "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
                "max_position_embeddings": 40960, "hidden_act": "silu"}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg_json))
    with pytest.raises(EngineError, match="not supported"):
        resolve_model_config(str(tmp_path))  # the real engine cannot run it
    mc = resolve_model_config(str(tmp_path), shape_only=True)
    assert mc.num_params() == pytest.approx(preset_config("qwen3-32b").num_params(), rel=1e-6)


def test_sim_and_plan_with_tensor_parallel(capsys):
    assert main(["sim", "--model", "qwen3-32b", "--tensor-parallel-size", "2", "--hardware",
                 "h100", "--num-requests", "20", "--rate", "4",
                 "--scheduler", "continuous"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "error unknown for h100-sxm" in out and "ASSUMED" not in out
    assert main(["plan", "--workload", "chat", "--rate", "1", "--num-requests", "40",
                 "--slo", "ttft_p99=5s,tpot_p99=200ms", "--hardware", "h100",
                 "--model", "llama-3.1-70b", "--price", "2",
                 "--space", "replicas=1-1;max_num_seqs=16;max_num_batched_tokens=2048"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "tp=4" in out and "--tensor-parallel-size 4" in out
    assert "$8.00/hour" in out  # 1 replica x 4 GPUs x $2
