"""The C++ causal prefill attention (kernels/csrc/cpu_prefill_attention.cpp) against the torch
backend's SDPA path it replaces and the oracle in kernels/reference.py: whole prompts, chunked
prefill and prefix-cache hits (queries at the end of a longer cached context), GQA, fp32 and
bf16, mixed with decode rows; and the switch back to SDPA."""

from __future__ import annotations

import pytest
import torch
from cbbench.kernels import cpu_attention, cpu_gemm
from cbbench.kernels.reference import make_paged_case, ref_paged_attention
from cbbench.kernels.torch_backend import TorchAttentionBackend

pytestmark = pytest.mark.skipif(
    not cpu_attention.available(), reason=f"CPU kernels: {cpu_gemm.unavailable_reason()}"
)

# (seq_lens, query_lens, block_size, num_kv_heads, group, head_dim)
CASES = [
    ([19, 40, 7], [19, 40, 7], 16, 8, 1, 64),  # whole prompts, no GQA
    ([130, 57], [20, 57], 16, 2, 4, 64),  # a chunk after 110 cached tokens (chunked prefill)
    ([90, 33, 64], [3, 1, 64], 8, 2, 3, 32),  # a prefix hit's 3-token tail, a decode row
    ([200], [200], 32, 1, 6, 128),  # one long prompt, MQA, head_dim 128
]


def _run(case, q_dtype, cache_dtype, kernel: bool) -> torch.Tensor:
    seq_lens, query_lens, bs, hkv, group, d = case
    c = make_paged_case(seq_lens, query_lens, bs, hkv, group, head_dim=d, seed=len(seq_lens))
    be = TorchAttentionBackend(torch.device("cpu"))
    be.prefill_kernel = kernel
    return be.paged_attention(
        c["q"].to(q_dtype), c["k_cache"].to(cache_dtype), c["v_cache"].to(cache_dtype),
        c["block_tables"], c["seq_lens"], c["query_start_loc"], d**-0.5,
    )  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=["prompts", "chunked", "prefix-hit", "mqa-128"])
@pytest.mark.parametrize(
    "q_dtype,cache_dtype",
    [(torch.float32,) * 2, (torch.bfloat16,) * 2, (torch.float32, torch.bfloat16)],
    ids=["fp32", "bf16", "fp32-bf16-cache"],
)
def test_prefill_matches_the_sdpa_path(case, q_dtype, cache_dtype):
    got = _run(case, q_dtype, cache_dtype, kernel=True)
    want = _run(case, q_dtype, cache_dtype, kernel=False)
    assert got.dtype == want.dtype == q_dtype
    tol = 1e-2 if q_dtype == torch.bfloat16 else 1e-5  # bf16: one rounding of the output
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def test_prefill_matches_the_oracle():
    seq_lens, query_lens = [45, 70, 17], [45, 9, 1]
    c = make_paged_case(seq_lens, query_lens, 16, 2, 2, head_dim=32, seed=3)
    out = torch.full_like(c["q"], float("nan"))
    args = (c["q"], c["k_cache"], c["v_cache"], c["block_tables"], c["seq_lens"])
    cpu_attention.paged_prefill_attention(*args, c["query_start_loc"], 0.3, out)
    ref = ref_paged_attention(*args, c["query_start_loc"], 0.3)
    torch.testing.assert_close(out[:54], ref[:54], atol=1e-5, rtol=1e-5)
    assert out[54:].isnan().all()  # the decode row (1 query) is left for the decode kernel


def test_bad_block_id_is_one_clear_error():
    c = make_paged_case([20], [20], 16, 2, 1, head_dim=16)
    c["block_tables"][0, 1] = 10_000
    with pytest.raises(RuntimeError, match="block 10000 outside the pool"):
        cpu_attention.paged_prefill_attention(
            c["q"], c["k_cache"], c["v_cache"], c["block_tables"], c["seq_lens"],
            c["query_start_loc"], 1.0, torch.empty_like(c["q"]),
        )  # fmt: skip


def test_backend_switches(monkeypatch):
    be = TorchAttentionBackend(torch.device("cpu"))
    assert be.prefill_kernel and be.describe()["prefill_kernel"] == "cpp"
    for off in ("0", " Off", "false", "no"):  # the CBBENCH_* switches' false words
        monkeypatch.setenv("CBBENCH_CPP_PREFILL", off)
        assert TorchAttentionBackend(torch.device("cpu")).describe()["prefill_kernel"] == "sdpa"
    monkeypatch.setenv("CBBENCH_CPP_PREFILL", "1")
    assert TorchAttentionBackend(torch.device("cpu")).prefill_kernel
    monkeypatch.delenv("CBBENCH_CPP_PREFILL")
    monkeypatch.setattr(cpu_attention, "available", lambda: False)  # a failed build
    assert not TorchAttentionBackend(torch.device("cpu")).prefill_kernel
    q = torch.zeros(4, 2, 24)  # head_dim off 16: SDPA
    assert not cpu_attention.supports_prefill(q, torch.zeros(1, 16, 2, 24))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_model_steps_with_chunks_and_a_prefix_hit_match_sdpa(dtype):
    """`tiny` (head_dim 16, GQA 2): step 1 prefills A's first 12 tokens and all of B; step 2
    A's other 18 (chunked prefill), B's decode, and C, whose first block is A's (a prefix
    hit: C computes from token 8). Hidden states and greedy tokens equal SDPA's."""
    from cbbench.reference_engine.core.executor import ScheduledChunk
    from cbbench.reference_engine.core.outputs import RequestMetrics
    from cbbench.reference_engine.core.sequence import Sequence
    from cbbench.reference_engine.execution.model_runner import ModelRunner, prepare_batch
    from cbbench.reference_engine.sampling_params import SamplingParams

    runner = ModelRunner("tiny", num_kv_blocks=16, block_size=8, dtype=dtype, num_threads=1)
    prompt_a = [(5 * j) % 300 + 1 for j in range(30)]
    prompts = {"a": prompt_a, "b": [7, 8, 9, 10, 11, 12, 13], "c": prompt_a[:8] + [50] * 12}
    tables = {"a": [0, 1, 2, 3], "b": [4, 5], "c": [0, 6, 7]}  # c shares a's first block
    seqs = {}
    for name, p in prompts.items():
        seqs[name] = Sequence(name, p, SamplingParams(temperature=0.0), RequestMetrics(0.0))
        seqs[name].block_table = tables[name]

    def chunk(name, start, n):
        seqs[name].num_computed_tokens = start
        return ScheduledChunk(seqs[name], n)

    def steps():
        yield [chunk("a", 0, 12), chunk("b", 0, 7)]
        seqs["b"].token_ids.append(99)
        yield [chunk("a", 12, 18), chunk("b", 7, 1), chunk("c", 8, 12)]

    kv = {flag: runner.kv_cache.clone() for flag in (False, True)}
    for chunks in steps():
        out = {}
        for flag in (False, True):
            runner.backend.prefill_kernel = flag
            b = prepare_batch(chunks, 8, runner.model_config.vocab_size, runner.device)
            with torch.inference_mode():
                h = runner.model(b.input_ids, b.positions, b.max_position, kv[flag], b.meta,
                                 runner.backend)  # fmt: skip
                logits = runner.model.compute_logits(h[[row for _, row in b.sample_rows]])
            out[flag] = (h.float(), logits.argmax(-1))
        tol = 2e-2 if dtype == "bfloat16" else 1e-5
        torch.testing.assert_close(out[True][0], out[False][0], atol=tol, rtol=tol)
        assert torch.equal(out[True][1], out[False][1])
    runner.backend.prefill_kernel = True
