"""The continuous scheduler's expert-balance admission: the balancer's choice, its effect on
the simulated decode batches' expert imbalance, the real model's routing predictor, and the
error on a dense model."""

from __future__ import annotations

import numpy as np
import pytest
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.core.outputs import RequestMetrics
from cbbench.reference_engine.core.sequence import Sequence
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.sampling_params import SamplingParams
from cbbench.reference_engine.scheduler.expert_balance import ExpertBalancer, imbalance


def seq(rid: str) -> Sequence:
    return Sequence(rid, [1, 2, 3], SamplingParams(max_tokens=4), RequestMetrics(0.0))


def test_balancer_picks_the_complement_within_its_window():
    hists = {"a": [9, 1, 0, 0], "b": [9, 0, 1, 0], "c": [0, 0, 5, 5], "d": [0, 0, 10, 0]}
    b = ExpertBalancer(lambda s: hists.get(s.request_id), 4, window=3)
    waiting = [seq(r) for r in ("a", "b", "c", "d")]
    load = [1.0, 1.0, 0.0, 1.0]  # the running batch leaves expert 2 idle
    assert b.pick(waiting, load, set()).request_id == "c"  # d is outside the window
    assert b.num_reordered == 1
    assert ExpertBalancer(b.histogram, 4, window=4).pick(waiting, load, set()).request_id == "d"
    assert b.pick(waiting, load, {waiting[2]}).request_id in {"a", "b", "d"}
    # nothing known: uniform shares everywhere, ties go to the head of the queue
    blind = ExpertBalancer(lambda s: None, 4, window=8)
    assert blind.pick(waiting, [1.0, 1.0, 1.0, 1.0], set()).request_id == "a"
    assert blind.num_reordered == 0
    assert imbalance([1, 1, 1, 1]) == 1.0 and imbalance([4, 0, 0, 0]) == 4.0


def _sim_run(balance: bool) -> tuple[dict[str, list[int]], float, int]:
    cfg = EngineConfig(
        model="mixtral-8x7b", dtype="bfloat16", executor="sim", hardware="h200",
        sim_expert_skew=3.0, sim_expert_topics=4, expert_parallel=8,
    )  # fmt: skip
    cfg.continuous.max_num_seqs = 8
    cfg.continuous.expert_balance = balance
    cfg.continuous.expert_balance_window = 32
    engine = LLMEngine.from_config(cfg)
    routing = engine.executor.routing
    # bursty topics: requests arrive in runs of one routing topic (24 each), so FCFS
    # batches are single-topic; the window spans two runs once both topics were seen
    for rid in sorted((f"req-{i}" for i in range(96)), key=routing.topic):
        engine.add_request(rid, list(range(1, 17)), SamplingParams(max_tokens=12))
    out: dict[str, list[int]] = {}
    shares = []
    while engine.has_unfinished_requests():
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
        load = sum(routing.last_histograms.values())
        if engine.get_stats().num_batched_tokens == engine.scheduler.num_running == 8:
            shares.append(imbalance(list(load)))  # a full decode batch
    balancer = engine.scheduler.balancer
    return out, float(np.mean(shares)), balancer.num_reordered if balancer else 0


def test_sim_expert_balance_lowers_decode_imbalance_same_outputs():
    plain, imb_plain, _ = _sim_run(False)
    balanced, imb_balanced, reordered = _sim_run(True)
    assert balanced == plain  # same requests, same tokens: only the order changed
    assert reordered > 0
    assert imb_balanced < 0.8 * imb_plain  # measured 3.95 -> 2.80


def test_real_moe_engine_predicts_routing_and_finishes(tmp_path):
    cfg = EngineConfig(model="tiny-moe", num_kv_blocks=256)
    cfg.continuous.max_num_seqs = 2
    cfg.continuous.expert_balance = True
    engine = LLMEngine.from_config(cfg)
    runner = engine.executor
    prompts = [[5, 6, 7, 8], [100, 101, 102], [5, 6, 7], [300, 301, 302, 303], [100, 102]]
    for i, p in enumerate(prompts):
        engine.add_request(f"q{i}", p, SamplingParams(max_tokens=3, temperature=0.0))
    engine.step()  # q0, q1 prefilled: the token table learned their prompts' routing
    pred = runner.expert_predictor
    assert pred is not None and set(pred.last) == {"q0", "q1"}
    assert sum(pred.last["q0"]) == 4 * 2 * 2  # tokens x top-2 x 2 sparse layers
    waiting = {s.request_id: s for s in engine.scheduler.waiting}
    seen = runner.expert_histogram(waiting["q2"])  # tokens 5, 6, 7 were seen in q0
    assert seen is not None and sum(seen) == pytest.approx(3 * 2 * 2)
    assert runner.expert_histogram(waiting["q3"]) is None  # never-seen tokens: unknown
    done = set()
    while engine.has_unfinished_requests():
        done |= {o.request_id for o in engine.step() if o.finished}
    assert done == {f"q{i}" for i in range(5)}


def test_expert_balance_on_a_dense_model_is_one_clear_error():
    cfg = EngineConfig(model="tiny", executor="sim", hardware="h200")
    cfg.continuous.expert_balance = True
    with pytest.raises(EngineError, match="expert_balance needs a mixture-of-experts"):
        LLMEngine.from_config(cfg)
    with pytest.raises(EngineError, match="expert_balance_window"):
        EngineConfig().continuous.__class__(expert_balance_window=0).validate()
