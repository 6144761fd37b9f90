"""Rejection sampling keeps the target distribution: over many seeded draws on a 5-token
vocabulary, the first emitted token follows p (chi-square), whatever the draft proposes,
with a draft distribution q or one-hot drafts; and a token emitted after an accepted draft
follows the next row's p. Greedy verification accepts exactly the argmax-equal prefix; n-gram
lookup proposes what followed the context's suffix."""

from __future__ import annotations

import torch
from cbbench.reference_engine.execution.rejection_sampler import (
    RejectionSampler,
    accept_greedy,
    sample_chunks,
)
from cbbench.reference_engine.execution.sampler import Sampler, SampleRequest
from cbbench.reference_engine.sampling_params import SamplingParams

CHI2_DF4_P001 = 18.467  # chi-square critical value, 4 degrees of freedom, p = 0.001
N = 4000
P0 = torch.tensor([0.40, 0.25, 0.20, 0.10, 0.05])
P1 = torch.tensor([0.05, 0.10, 0.15, 0.30, 0.40])
Q = torch.tensor([0.10, 0.50, 0.10, 0.20, 0.10])
PARAMS = SamplingParams(temperature=1.0)


def chi2(counts: torch.Tensor, p: torch.Tensor) -> float:
    expected = p * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def _draws(draft_probs: torch.Tensor | None, draft_token=None):
    rs = RejectionSampler(seed=1)
    probs = torch.stack([P0, P1, P0])
    gen = torch.Generator().manual_seed(7)
    first = torch.zeros(5)
    second = torch.zeros(5)
    accepted = 0
    for _ in range(N):
        if draft_probs is None:
            drafts = [draft_token, draft_token]
        else:  # drafts drawn from q, as a sampling draft model would
            drafts = torch.multinomial(draft_probs, 1, generator=gen).flatten().tolist()
        out = rs(probs, drafts, PARAMS, 10, draft_probs)
        first[out[0]] += 1
        if out[0] == drafts[0]:
            accepted += 1
            assert len(out) >= 2
            second[out[1]] += 1
    return first, second, accepted


def test_first_token_follows_target_with_draft_distribution():
    first, second, accepted = _draws(torch.stack([Q, Q]))
    assert chi2(first, P0) < CHI2_DF4_P001
    assert chi2(second, P1) < CHI2_DF4_P001
    # acceptance rate of a q-draft is sum(min(p, q)) = 0.65
    assert abs(accepted / N - float(torch.minimum(P0, Q).sum())) < 0.03


def test_first_token_follows_target_with_one_hot_drafts():
    for tok in (0, 3):
        first, second, accepted = _draws(None, draft_token=tok)
        assert chi2(first, P0) < CHI2_DF4_P001
        assert chi2(second, P1) < CHI2_DF4_P001
        assert abs(accepted / N - float(P0[tok])) < 0.03


def test_a_biased_sampler_would_fail_the_check():
    """The statistic has teeth: counts drawn from q instead of p are rejected."""
    gen = torch.Generator().manual_seed(0)
    counts = torch.bincount(torch.multinomial(Q, N, replacement=True, generator=gen), minlength=5)
    assert chi2(counts.float(), P0) > CHI2_DF4_P001


def test_seeded_requests_repeat():
    probs = torch.stack([P0, P1, P0])
    seeded = SamplingParams(temperature=1.0, seed=42)
    a = [RejectionSampler(seed=s)(probs, [1, 2], seeded, 7) for s in (0, 1)]
    assert a[0] == a[1]  # the request's seed, not the runner's, decides


def test_accept_greedy():
    assert accept_greedy([5, 6, 7], [5, 6]) == [5, 6, 7]  # all accepted + bonus
    assert accept_greedy([5, 9, 7], [5, 6]) == [5, 9]  # mismatch: the target's token
    assert accept_greedy([4, 6, 7], [5, 6]) == [4]
    assert accept_greedy([3], []) == [3]


def test_sample_chunks_mixed_batch():
    """A plain chunk, a greedy chunk with drafts, a sampled chunk with drafts, one batch."""
    vocab = 5
    logits = torch.full((6, vocab), -10.0)
    for r, t in enumerate([2, 1, 3, 0, 4, 4]):
        logits[r, t] = 10.0  # near one-hot rows
    greedy = SamplingParams(temperature=0)
    sampled = SamplingParams(temperature=1.0, seed=5)
    reqs = [SampleRequest(greedy, 10, 1)]
    reqs += [SampleRequest(greedy, 20 + j, 2 + j) for j in range(3)]
    reqs += [SampleRequest(sampled, 30 + j, 3 + j) for j in range(2)]
    rows = [0, 1, 1, 1, 2, 2]
    drafts = [[], [1, 4], [4]]
    out = sample_chunks(
        Sampler((), torch.device("cpu")), RejectionSampler(), logits, reqs, rows, drafts
    )
    assert out[0] == [2]
    assert out[1] == [1, 3]  # 1 accepted, 4 != 3 rejected -> the target's 3
    assert out[2] == [4, 4]  # p(4) ~ 1: accepted, then the bonus from row 2


def test_ngram_lookup():
    from cbbench.reference_engine.spec_decode.proposer_ngram import ngram_lookup

    assert ngram_lookup([1, 2, 3, 4, 1, 2], 1, 3, 3) == [3, 4, 1]  # suffix [1, 2] seen at 0
    assert ngram_lookup([1, 2, 3, 4, 5], 1, 3, 3) == []  # no repeat
    assert ngram_lookup([7, 1, 2, 9, 9, 1, 2, 8, 1, 2], 2, 2, 1) == [8]  # latest full match
    # a 2-cycle: the latest match has 2 tokens after it, the earliest has k
    assert ngram_lookup([5, 6, 5, 6, 5, 6, 5, 6], 1, 3, 4) == [5, 6, 5, 6]
    assert ngram_lookup([5, 5], 2, 3, 4) == []  # the suffix itself does not count
