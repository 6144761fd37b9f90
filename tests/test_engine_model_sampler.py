"""Sampler: greedy, temperature / top-k / top-p supports, per-request seeds independent of
the batch, min_tokens masking of stop tokens."""

from __future__ import annotations

import torch
from cbbench.reference_engine.execution.sampler import Sampler, SampleRequest, inverse_cdf
from cbbench.reference_engine.sampling_params import SamplingParams

V = 50
EOS = 7


def _sampler(seed: int = 0) -> Sampler:
    return Sampler((EOS,), torch.device("cpu"), seed)


def _req(num_tokens: int = 10, num_output: int = 3, **kw) -> SampleRequest:
    return SampleRequest(SamplingParams(**kw), num_tokens, num_output)


def _logits(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, V, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax():
    logits = _logits(4)
    got = _sampler()(logits.clone(), [_req(temperature=0.0) for _ in range(4)])
    assert got == logits.argmax(-1).tolist()
    # top_k=1 is greedy whatever the temperature
    assert _sampler()(logits.clone(), [_req(top_k=1, temperature=2.0)] * 4) == got


def test_top_k_and_top_p_restrict_the_support():
    logits = _logits(1, seed=3)
    order = logits[0].argsort(descending=True).tolist()
    probs = logits[0].softmax(-1)[order]
    # the smallest prefix of the sorted vocabulary whose mass reaches 0.6
    nucleus = order[: int((probs.cumsum(0) < 0.6).sum()) + 1]
    s = _sampler(1)
    seen_k, seen_p, seen_all = set(), set(), set()
    for _ in range(300):
        seen_k |= set(s(logits.clone(), [_req(top_k=3)]))
        seen_p |= set(s(logits.clone(), [_req(top_p=0.6)]))
        seen_all |= set(s(logits.clone(), [_req(temperature=5.0)]))
    assert seen_k == set(order[:3])
    assert seen_p == set(nucleus) and len(nucleus) > 1
    assert len(seen_all) > len(nucleus) + 3  # high temperature, no filter: wide support


def test_seeded_request_same_tokens_whatever_the_batch():
    target = _req(num_tokens=12, seed=42, temperature=1.0, top_p=0.9)
    row = _logits(1, seed=9)
    alone = [_sampler(0)(row.clone(), [target])[0] for _ in range(3)]
    assert len(set(alone)) == 1  # same (seed, position): same token
    others = _logits(5, seed=1)
    for pos, seed in ((0, 1), (2, 7), (5, 123)):
        batch = torch.cat([others[:pos], row, others[pos:]])
        reqs = [_req(seed=None, temperature=1.0) for _ in range(5)]
        reqs.insert(pos, target)
        assert _sampler(seed)(batch, reqs)[pos] == alone[0]
    # the next position draws differently seeded noise: over many positions, several tokens
    draws = {_sampler()(row.clone(), [_req(num_tokens=n, seed=42)])[0] for n in range(40)}
    assert len(draws) > 3


def test_unseeded_requests_follow_the_runner_seed():
    logits = _logits(6)
    reqs = [_req(temperature=1.0) for _ in range(6)]

    def draws(seed: int) -> list[list[int]]:
        s = _sampler(seed)
        return [s(logits.clone(), reqs) for _ in range(5)]

    assert draws(5) == draws(5)
    assert draws(5) != draws(6)
    assert len({tuple(d) for d in draws(5)}) > 1  # the shared generator advances


def test_min_tokens_masks_eos_and_stop_tokens():
    logits = torch.zeros(3, V)
    logits[:, EOS] = 100.0
    logits[:, 11] = 90.0
    logits[:, 20] = 80.0
    reqs = [
        _req(num_output=1, min_tokens=2, max_tokens=8, temperature=0.0),  # EOS masked
        _req(num_output=1, min_tokens=2, max_tokens=8, stop_token_ids=(11,), temperature=0.0),
        _req(num_output=2, min_tokens=2, max_tokens=8, temperature=0.0),  # reached: EOS allowed
    ]
    assert _sampler()(logits.clone(), reqs) == [11, 20, EOS]
    ignore = _req(num_output=0, min_tokens=2, max_tokens=8, ignore_eos=True, temperature=0.0)
    assert _sampler()(logits.clone()[:1], [ignore]) == [EOS]


def test_inverse_cdf_draws_follow_the_probabilities():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.25, 0.25, 0.0]])  # exact in binary
    edges = torch.tensor([[0.0], [0.25 - 1e-12], [0.25], [0.5], [1.0 - 1e-12]], dtype=torch.float64)
    got = inverse_cdf(probs.expand(5, -1), edges).tolist()
    assert got == [4, 4, 3, 1, 1]  # u = 0 takes the whole mass: the last nonzero token
    n = 20_000
    u = torch.rand(n, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(inverse_cdf(probs.expand(n, -1), u), minlength=6).double() / n
    assert counts[[0, 2, 5]].sum() == 0  # zero-probability tokens never drawn
    assert torch.allclose(counts, probs[0].double(), atol=0.015)
    # unnormalised rows: the total is read from the row itself
    assert inverse_cdf(probs * 7, edges[2:3]).tolist() == [3]


def test_sampled_tokens_follow_the_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -30.0]])
    s = _sampler(3)
    picks = [s(logits.clone(), [_req(temperature=1.0)])[0] for _ in range(3000)]
    freq = torch.bincount(torch.tensor(picks), minlength=4).double() / len(picks)
    assert torch.allclose(freq, logits[0].softmax(-1).double(), atol=0.03)


def test_top_k_past_the_vocabulary_is_all_of_it():
    """A top_k beyond the vocabulary (even past int64, as a fuzzed request sends) samples as no
    top_k does, never crashing the engine."""
    logits = _logits(2, seed=4)
    same = _sampler(2)(logits.clone(), [_req(temperature=0.5, seed=1)] * 2)
    for k in (V + 1, 2**70):
        assert _sampler(2)(logits.clone(), [_req(temperature=0.5, seed=1, top_k=k)] * 2) == same
