"""Speculative decoding in the continuous scheduler, property-tested on the simulator
(hypothesis): random request streams, tiny pools (preemption), chunked prefill, prefix
caching, aborts, k and acceptance rate drawn. After every step `check_invariants` holds
(ref counts = holders, free list exact, no lookahead block left after rollback, cached
blocks hash kept tokens only); at the end the pool is whole, the token budget (drafts
included) held, and every request got exactly the tokens it gets without speculation."""

from __future__ import annotations

from engine_sched_support import Req, drive, sim_engine
from hypothesis import given
from hypothesis import strategies as st
from test_engine_sched_properties import (
    MAX_LEN,
    SETTINGS,
    abort_plans,
    check_common,
    streams,
)


@st.composite
def spec_cases(draw):
    reqs = draw(streams())
    max_num_seqs = draw(st.integers(1, 6))
    k = draw(st.integers(1, 6))
    cfg = {
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": draw(st.integers(max_num_seqs, 48)),
        "enable_chunked_prefill": True,
        "max_prefills_per_step": draw(st.sampled_from([None, 1])),
    }
    spec = {
        "method": draw(st.sampled_from(["ngram", "draft"])),
        "model": "tiny",
        "num_speculative_tokens": k,
        "acceptance_rate": draw(st.sampled_from([0.0, 0.5, 0.9, 1.0])),
    }
    num_blocks = draw(st.integers(MAX_LEN // 4, 40))
    return reqs, cfg, spec, num_blocks, draw(st.booleans()), draw(abort_plans(reqs))


@SETTINGS
@given(spec_cases())
def test_speculative_continuous_properties(case):
    reqs, cfg, spec, num_blocks, prefix, aborts = case
    e = sim_engine(
        continuous=cfg,
        num_kv_blocks=num_blocks,
        max_model_len=MAX_LEN,
        prefix_caching=prefix,
        speculative=spec,
    )
    trace = drive(e, reqs, aborts)
    check_common(e, trace, reqs, aborts)  # outputs equal the non-speculative reference
    assert all(n <= cfg["max_num_batched_tokens"] for n in trace.tokens_per_step)
    assert trace.max_blocks_used <= num_blocks
    s = e.spec_stats
    assert (
        s.num_accepted_tokens <= s.num_draft_tokens <= s.num_drafts * spec["num_speculative_tokens"]
    )
    assert sum(s.accepted_per_pos) == s.num_accepted_tokens
    assert all(a >= b for a, b in zip(s.accepted_per_pos, s.accepted_per_pos[1:], strict=False))
    if spec["acceptance_rate"] == 1.0:
        assert s.num_accepted_tokens == s.num_draft_tokens
    if spec["acceptance_rate"] == 0.0:
        assert s.num_accepted_tokens == 0


def test_full_acceptance_cuts_steps():
    """Acceptance 1 with k = 3: a lone decode emits 4 tokens per step."""
    reqs = [Req("a", [1, 2, 3], 40)]
    plain = drive(sim_engine(max_model_len=MAX_LEN), reqs)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": 1.0}
    fast = drive(sim_engine(max_model_len=MAX_LEN, speculative=spec), reqs)
    assert fast.outputs == plain.outputs
    assert len(plain.steps) == 40  # prefill emits 1, then 39 decodes
    assert len(fast.steps) == 1 + -(-39 // 4)
