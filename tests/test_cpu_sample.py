"""The C++ sampler (kernels/csrc/cpu_sample.cpp) against the inverse CDF it implements, and
the engine's Sampler taking it for rows at a temperature alone."""

from __future__ import annotations

import pytest
import torch
from cbbench.kernels import cpu_gemm, cpu_ops
from cbbench.reference_engine.execution.sampler import Sampler, SampleRequest, inverse_cdf
from cbbench.reference_engine.sampling_params import SamplingParams

pytestmark = pytest.mark.skipif(
    not cpu_ops.available(), reason=f"CPU kernels: {cpu_gemm.unavailable_reason()}"
)


def _weights(x: torch.Tensor, temp: float) -> torch.Tensor:
    """fp64 weights of one row as the draw defines them: exp(x / T - max)."""
    y = (x / torch.tensor(temp, dtype=torch.float32)).double()
    return torch.exp(y - y.max())


def _check_pick(x: torch.Tensor, temp: float, u: float, pick: int) -> None:
    """pick is the first index whose running weight reaches (1 - u) of the total (fp64,
    up to rounding of the sums at the boundary), and it has a positive weight."""
    w = _weights(x, temp)
    cdf = w.cumsum(0)
    total = float(cdf[-1])
    target = (1.0 - u) * total
    tol = 1e-6 * total
    assert w[pick] > 0, f"picked token {pick} of zero weight"
    before = float(cdf[pick - 1]) if pick else 0.0
    assert before < target + tol and float(cdf[pick]) >= target - tol, (pick, before, target)


@pytest.mark.parametrize("vocab", [1, 2, 15, 16, 17, 33, 1000, 32000])
def test_picks_are_the_inverse_cdf(vocab):
    gen = torch.Generator().manual_seed(vocab)
    n = 16
    x = torch.randn(n, vocab, generator=gen) * torch.rand(n, 1, generator=gen) * 8
    if vocab > 4:
        x[:, torch.randint(0, vocab, (3,), generator=gen)] = float("-inf")  # masked tokens
    temps = torch.rand(n, generator=gen) * 2 + 0.05
    u = torch.rand(n, dtype=torch.float64, generator=gen)
    u[0], u[1] = 0.0, 1.0 - 2**-53  # the last positive weight; the first
    got = torch.tensor(cpu_ops.sample_rows(x, list(range(n)), temps.tolist(), u.tolist()))
    for r in range(n):
        _check_pick(x[r], float(temps[r]), float(u[r]), int(got[r]))
    # the torch path (softmax, fp64 cumsum, searchsorted) picks the same but for rounding
    # (rows 0 and 1 sit on a boundary by construction: either side is right there)
    probs = torch.softmax(x / temps[:, None], dim=-1)
    assert torch.equal(inverse_cdf(probs, u[:, None])[2:], got[2:])


def test_a_grid_of_u_lands_in_proportion_to_the_softmax():
    x = torch.tensor([[0.0, 1.0, float("-inf"), 2.0, -1.0] + [float("-inf")] * 14])
    p = torch.softmax(x[0].double() / 0.7, dim=0)
    m = 20000
    u = (torch.arange(m, dtype=torch.float64) + 0.5) / m
    got = cpu_ops.sample_rows(x, [0] * m, [0.7] * m, u.tolist())
    counts = torch.bincount(torch.tensor(got), minlength=x.shape[1]).double()
    assert counts[p == 0].sum() == 0
    assert torch.all((counts - p * m).abs() <= 1.0)  # each token's share of a uniform grid


def test_draws_only_the_rows_asked_and_declines_nan_inf_and_all_masked():
    x = torch.randn(6, 40)
    x[1, 3] = float("nan")
    x[2, 5] = float("inf")
    x[3] = float("-inf")
    got = cpu_ops.sample_rows(x, [4, 1, 2, 3, 0], [1.0] * 5, [0.25] * 5)
    assert got[1:4] == [-1, -1, -1]
    _check_pick(x[4], 1.0, 0.25, int(got[0]))
    _check_pick(x[0], 1.0, 0.25, int(got[4]))


def test_bad_arguments_are_errors_not_crashes():
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="out of range"):
        cpu_ops.sample_rows(x, [2], [1.0], [0.0])
    with pytest.raises(RuntimeError, match="temperature"):
        cpu_ops.sample_rows(x, [0], [0.0], [0.0])
    with pytest.raises(RuntimeError, match="temperature"):
        cpu_ops.sample_rows(x, [0], [1.0], [1.0])
    with pytest.raises(RuntimeError, match="one temperature and one u per row"):
        cpu_ops.sample_rows(x, [0, 1], [1.0], [0.5])


def _req(n: int, **kw) -> SampleRequest:
    return SampleRequest(SamplingParams(max_tokens=8, **kw), num_tokens=n, num_output_tokens=1)


def test_sampler_takes_the_kernel_for_plain_rows_and_torch_for_the_rest(monkeypatch):
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 500, generator=gen) * 3
    logits[3, 7] = float("nan")  # declined by the kernel: torch draws it
    reqs = [_req(10, temperature=0.8, seed=1), _req(11, temperature=0.0),
            _req(12, temperature=1.3, seed=2), _req(13, temperature=1.0, seed=3),
            _req(14, temperature=1.0, seed=4)]  # fmt: skip
    calls = []
    real = cpu_ops.sample_rows
    monkeypatch.setattr(cpu_ops, "sample_rows", lambda *a: calls.append(list(a[1])) or real(*a))
    got = Sampler((), torch.device("cpu"))(logits.clone(), reqs)
    assert calls == [[0, 2, 3, 4]]
    assert got[1] == int(logits[1].argmax())
    for i in (0, 2, 4):
        g = torch.Generator().manual_seed(
            (reqs[i].params.seed * 0x9E3779B97F4A7C15 + reqs[i].num_tokens) % (1 << 63)
        )
        u = float(torch.empty(1, dtype=torch.float64).uniform_(generator=g))
        _check_pick(logits[i], reqs[i].params.temperature, u, got[i])
    # with top-k in the batch every sampled row goes through torch, within its top k
    calls.clear()
    reqs[2] = _req(12, temperature=1.3, seed=2, top_k=3)
    got = Sampler((), torch.device("cpu"))(logits.clone(), reqs)
    assert calls == []
    assert got[2] in logits[2].topk(3).indices.tolist()


def test_seeded_rows_draw_the_same_tokens_whatever_the_batch():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 300, generator=gen)
    reqs = [_req(20 + i, temperature=0.9, seed=100 + i) for i in range(4)]
    together = Sampler((), torch.device("cpu"), seed=5)(logits.clone(), reqs)
    alone = [Sampler((), torch.device("cpu"), seed=9)(logits[i : i + 1].clone(), [reqs[i]])[0]
             for i in range(4)]  # fmt: skip
    assert together == alone
