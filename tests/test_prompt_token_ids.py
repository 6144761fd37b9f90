"""One request -> prompt-token-ids function: an HTTP run (the load generator's PromptBuilder),
an offline replay on the real model and a simulated replay send the same ids for the same
workload, prefixes shared where the workload says so."""

from __future__ import annotations

import numpy as np
import pytest
from cbbench.harness.load.prompts import PromptBuilder
from cbbench.reference_engine.config.options import build_engine_config
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.sim.simulate import replay
from cbbench.workloads.loader import build_from_spec
from cbbench.workloads.tokens import (
    DEFAULT_ID_RANGE,
    OWN_STREAM,
    PREFIX_STREAM,
    PromptTokenIds,
    hash_ids,
)

SPEC = {
    "num_requests": 6,
    "seed": 7,
    "prompt": {"dist": "uniform", "min": 20, "max": 60},
    "output": 2,
    "prefix": {"shared_blocks": 1, "groups": 2, "block_size": 16},
}


def _engine_prompts(monkeypatch, executor: str) -> dict[int, list[int]]:
    seen: dict[int, list[int]] = {}
    real_add = LLMEngine.add_request

    def add(self, request_id, prompt_token_ids, *args, **kwargs):
        seen[int(request_id.split("-")[1])] = list(prompt_token_ids)
        return real_add(self, request_id, prompt_token_ids, *args, **kwargs)

    monkeypatch.setattr(LLMEngine, "add_request", add)
    wl = build_from_spec(SPEC, "t", "test")
    cfg = build_engine_config({"model": "tiny", "executor": executor, "max_model_len": 128})
    replay(wl.requests, cfg, prefix_block_size=wl.prefix_block_size, seed=wl.seed)
    return seen


@pytest.mark.parametrize("executor", ["sim", "real"])
def test_the_same_workload_sends_the_same_ids_on_every_path(monkeypatch, executor):
    wl = build_from_spec(SPEC, "t", "test")
    http = PromptBuilder(wl.seed, wl.prefix_block_size)  # what the load generator sends
    want = {r.index: http.token_ids(r.index, r.prompt_len, r.prefix_ids) for r in wl.requests}
    assert _engine_prompts(monkeypatch, executor) == want
    # requests of one prefix group share their first block, others do not
    by_group: dict[int, list[int]] = {}
    for r in wl.requests:
        by_group.setdefault(r.prefix_ids[0], []).append(r.index)
    groups = [g for g in by_group.values() if len(g) > 1]
    assert groups, "the spec should put several requests in one prefix group"
    a, b = groups[0][:2]
    assert want[a][:16] == want[b][:16] and want[a][16:20] != want[b][16:20]


def test_the_seed_changes_the_ids():
    a = PromptBuilder(1).token_ids(0, 32)
    assert a == PromptBuilder(1).token_ids(0, 32) and a != PromptBuilder(2).token_ids(0, 32)


def test_one_function_alone_in_a_batch_or_prefetched():
    """`many` (the look-ahead's batches) and a call per request give the same ids, and both
    are the documented hash: vocab[h(seed, stream, key, position) % len(vocab)]."""
    reqs = [(0, 16, ()), (7, 3, ()), (9, 40, (1, 2)), (10, 20, (2,)), (11, 0, ()), (12, 5, (1,))]
    alone = [PromptTokenIds(5, 16)(*r) for r in reqs]
    assert PromptTokenIds(5, 16).many(reqs) == alone
    assert [len(ids) for ids in alone] == [n for _, n, _ in reqs]
    pool = PromptTokenIds(5, 16).vocab
    assert alone[0] == pool[hash_ids(5, OWN_STREAM, [0], [16], len(pool))].tolist()
    block2 = pool[hash_ids(5, PREFIX_STREAM, [2], [16], len(pool))].tolist()
    assert alone[3] == block2 + alone[3][16:] and alone[2][16:32] == block2
    builder = PromptBuilder(5, 16)
    builder.prefetch(reqs)
    assert [builder.token_ids(*r) for r in reqs] == alone and not builder._ready


def test_ids_cover_the_pool_evenly():
    ids = np.array(PromptTokenIds(0).many([(i, 64, ()) for i in range(400)]))
    lo, hi = DEFAULT_ID_RANGE
    counts = np.bincount(ids.ravel() - lo, minlength=hi - lo)
    assert ids.min() >= lo and ids.max() < hi and counts.min() > 0
    expected = ids.size / (hi - lo)  # ~52 a value; a chi-square far above its df is a bias
    assert ((counts - expected) ** 2 / expected).sum() < 1.3 * (hi - lo)
    assert len({tuple(r) for r in ids}) == 400  # no two requests alike
