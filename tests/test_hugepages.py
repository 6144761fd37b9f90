"""The CPU engine's weights, packed panels and KV cache on 2 MiB transparent huge pages
(reference_engine/execution/hugepages.py): an HF checkpoint loaded by the ModelRunner lands
on huge pages where the host's THP mode allows it (AnonHugePages grows by about the
weights' size), every output is bitwise what ordinary pages give, and the switch and the
fallbacks say why in one line."""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path

import pytest
import torch
from cbbench.reference_engine.core.executor import ScheduledChunk
from cbbench.reference_engine.core.outputs import RequestMetrics
from cbbench.reference_engine.core.sequence import Sequence
from cbbench.reference_engine.execution import hugepages
from cbbench.reference_engine.execution.model_runner import ModelRunner, prepare_batch
from cbbench.reference_engine.model.config import preset_config
from cbbench.reference_engine.model.loader import save_random_model
from cbbench.reference_engine.sampling_params import SamplingParams

# ~16 MB of fp32 weights: several 2 MiB pages in every large tensor's neighbourhood
CFG = dataclasses.replace(
    preset_config("tiny"), vocab_size=4096, hidden_size=256, intermediate_size=1024,
    num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
)  # fmt: skip


def _anon_huge() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    return 0


def _steps(runner: ModelRunner) -> list[torch.Tensor]:
    """Logits of a prefill of three prompts and two greedy decode steps."""
    chunks, out = [], []
    for i, n in enumerate((19, 3, 11)):
        prompt = [(11 * i + j) % 200 + 1 for j in range(n)]
        seq = Sequence(str(i), prompt, SamplingParams(temperature=0.0), RequestMetrics(0.0))
        seq.block_table = list(range(i * 4, (i + 1) * 4))
        chunks.append(ScheduledChunk(seq, n))
    for _ in range(3):
        b = prepare_batch(chunks, runner.block_size, runner.model_config.vocab_size, runner.device)
        with torch.inference_mode():
            h = runner.model(b.input_ids, b.positions, b.max_position, runner.kv_cache, b.meta,
                             runner.backend)  # fmt: skip
            logits = runner.model.compute_logits(h[[row for _, row in b.sample_rows]])
        out.append(logits.clone())
        for c, tok in zip(chunks, logits.argmax(-1).tolist(), strict=True):
            c.seq.token_ids.append(tok)
            c.seq.num_computed_tokens = c.seq.num_tokens - 1
        chunks = [ScheduledChunk(c.seq, 1) for c in chunks]
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_random_model(CFG, tmp_path_factory.mktemp("hp"), seed=1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_checkpoint_weights_on_huge_pages_bitwise(checkpoint, dtype, monkeypatch):
    monkeypatch.setenv(hugepages.ENV, "0")
    plain = ModelRunner(str(checkpoint), num_kv_blocks=16, block_size=8, dtype=dtype)
    assert "ordinary pages (off" in plain.hugepages
    want = _steps(plain)
    del plain
    gc.collect()

    monkeypatch.setenv(hugepages.ENV, "1")
    before = _anon_huge()
    runner = ModelRunner(str(checkpoint), num_kv_blocks=16, block_size=8, dtype=dtype)
    grown = _anon_huge() - before
    arena = runner.weights_arena
    reason = hugepages.unavailable_reason()
    if reason is None:  # THP "madvise" or "always": the fault path (or MADV_COLLAPSE) got them
        whole = arena.nbytes // hugepages.HUGE * hugepages.HUGE  # full 2 MiB pages
        assert arena.huge_bytes() >= whole, runner.hugepages
        assert grown >= 0.9 * whole, (grown, runner.hugepages)
        assert "of it on 2 MiB pages" in runner.hugepages
        head = runner.model.lm_head
        packed = getattr(head, "panels", None)
        on_arena = packed if packed is not None else head.weight  # the LM head's panels
        assert hugepages.mapping_huge_bytes(on_arena.data_ptr()) == arena.huge_bytes()
        assert hugepages.mapping_huge_bytes(runner.kv_cache.data_ptr()) > 0
    else:  # THP "never" or no madvise: ordinary pages, said so
        assert reason in runner.hugepages and arena.huge_bytes() == 0
    got = _steps(runner)
    for w, g in zip(want, got, strict=True):
        assert torch.equal(g, w)


def test_tied_tensors_stay_tied_and_values_bitwise():
    from torch import nn

    emb = nn.Embedding(3000, 256)
    head = nn.Linear(256, 3000, bias=False)
    head.weight = emb.weight
    net = nn.ModuleDict({"emb": emb, "head": head})
    net.head.extra = torch.randn(1000, 300)  # a packed-panel-like plain attribute
    want_w, want_x = emb.weight.detach().clone(), net.head.extra.clone()
    arena = hugepages.move_module(net)
    assert net.head.weight is net.emb.weight and isinstance(net.emb.weight, nn.Parameter)
    assert torch.equal(net.emb.weight, want_w) and torch.equal(net.head.extra, want_x)
    if arena.reason is None:
        assert hugepages.mapping_huge_bytes(net.head.extra.data_ptr()) > 0
        assert net.emb.weight.data_ptr() % 4096 == 0


def test_thp_never_falls_back_with_the_reason(tmp_path, monkeypatch):
    fake = tmp_path / "enabled"
    fake.write_text("always madvise [never]\n")
    monkeypatch.setattr(hugepages, "THP_ENABLED", fake)
    t, arena = hugepages.zeros((1024, 1024), torch.float32)
    assert torch.count_nonzero(t) == 0 and arena.huge_bytes() == 0
    assert arena.status == "KV cache: 4 MB on ordinary pages (transparent huge pages are " \
        "'never' on this host)"
    monkeypatch.setattr(hugepages, "THP_ENABLED", tmp_path / "absent")
    assert "unreadable" in (hugepages.unavailable_reason() or "")
