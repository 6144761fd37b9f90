"""Verify draft tokens against the target model in one forward's logits.

A chunk carrying k drafts gets k + 1 logits rows: row j scores the token after known tokens
plus drafts[:j]. Greedy requests accept the longest prefix of drafts equal to the target's
argmax, then add the argmax at the first mismatch (or after the last draft: the bonus token),
so greedy output is token-for-token the output without speculation.

Sampled requests use rejection sampling (Leviathan et al. 2023; Chen et al. 2023): draft x at
row j is accepted with probability min(1, p(x) / q(x)); on rejection a token is drawn from
the residual max(p - q, 0) (renormalised) and the chunk stops there; when all k drafts pass, a
bonus token is drawn from row k. Each emitted token is then distributed exactly as the target
alone would sample it. `q` is the draft's distribution; proposers that pick deterministically
(n-gram lookup, a greedy draft model) have a one-hot q, for which acceptance is p(x) and the
residual is p without x.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from cbbench.reference_engine.execution.sampler import Sampler, SampleRequest
from cbbench.reference_engine.sampling_params import SamplingParams

_SEED_MIX = 0x9E3779B97F4A7C15
_SALT = 0x5BD1E995  # keeps these draws apart from the plain sampler's noise for the same seed


def accept_greedy(target_ids: Sequence[int], draft: Sequence[int]) -> list[int]:
    """target_ids: the target's argmax for each of the len(draft) + 1 rows."""
    assert len(target_ids) == len(draft) + 1
    out: list[int] = []
    for t, d in zip(target_ids, draft, strict=False):
        out.append(t)
        if t != d:
            return out
    out.append(target_ids[-1])
    return out


class RejectionSampler:
    def __init__(self, device: torch.device | str = "cpu", seed: int = 0) -> None:
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device).manual_seed(seed ^ _SALT)
        self._row_generator = torch.Generator(device=self.device)

    def _gen(self, params: SamplingParams, num_tokens: int) -> torch.Generator:
        if params.seed is None:
            return self.generator
        step_seed = (params.seed * _SEED_MIX + num_tokens + _SALT) % (1 << 63)
        return self._row_generator.manual_seed(step_seed)

    def __call__(
        self,
        probs: torch.Tensor,
        draft: Sequence[int],
        params: SamplingParams,
        num_tokens: int,
        draft_probs: torch.Tensor | None = None,
    ) -> list[int]:
        """probs [k + 1, V]: the target's sampling distribution per row; draft_probs [k, V]
        (None: one-hot drafts). num_tokens: the sequence's length before this step (seeds a
        seeded request's draws). Returns the accepted drafts plus one sampled token."""
        k = len(draft)
        assert probs.shape[0] == k + 1
        assert draft_probs is None or draft_probs.shape[0] == k
        gen = self._gen(params, num_tokens)
        u = torch.rand(k, generator=gen, device=self.device).tolist()
        out: list[int] = []
        for j, x in enumerate(draft):
            p = float(probs[j, x])
            q = 1.0 if draft_probs is None else float(draft_probs[j, x])
            if u[j] * q < p:  # accept with probability min(1, p / q)
                out.append(x)
                continue
            if draft_probs is None:
                residual = probs[j].clone()
                residual[x] = 0.0
            else:
                residual = (probs[j] - draft_probs[j]).clamp_min(0.0)
            if float(residual.sum()) <= 0.0:  # p == q up to rounding: any draw from p is exact
                residual = probs[j]
            out.append(int(torch.multinomial(residual, 1, generator=gen)))
            return out
        out.append(int(torch.multinomial(probs[k], 1, generator=gen)))
        return out


def sample_chunks(
    sampler: Sampler,
    rejection: RejectionSampler,
    logits: torch.Tensor,
    reqs: list[SampleRequest],
    rows: list[int],
    drafts: list[list[int]],
    draft_probs: list[torch.Tensor | None] | None = None,
) -> list[list[int]]:
    """logits [R, V] with one row per SampleRequest; rows[r] is the chunk (index into
    drafts) that row r belongs to, each chunk's rows consecutive (len(drafts[c]) + 1 of
    them); draft_probs[c]: q of chunk c's drafts [k, V], None for one-hot drafts. Returns
    the new tokens of each chunk that has rows."""
    out: list[list[int]] = [[] for _ in drafts]
    if not any(drafts):
        for c, tok in zip(rows, sampler(logits, reqs), strict=True):
            out[c].append(tok)
        return out
    # plain rows (no drafts, or greedy: the argmax decides) go through the sampler in one call
    plain = [r for r, c in enumerate(rows) if not drafts[c] or reqs[r].params.greedy]
    spans: dict[int, list[int]] = {}
    for r, c in enumerate(rows):
        spans.setdefault(c, []).append(r)
    picked: dict[int, int] = {}
    if plain:
        picked = dict(zip(plain, sampler(logits[plain], [reqs[r] for r in plain]), strict=True))
    for c, rs in spans.items():
        if not drafts[c]:
            out[c] = [picked[rs[0]]]
        elif rs[0] in picked:
            out[c] = accept_greedy([picked[r] for r in rs], drafts[c])
        else:
            sub = logits[rs].float()  # probabilities in fp32 whatever the model dtype
            sub_reqs = [reqs[r] for r in rs]
            sampler._mask_stop_tokens(sub, sub_reqs)
            probs = Sampler._probs(sub, [r.params for r in sub_reqs])
            q = draft_probs[c] if draft_probs is not None else None
            out[c] = rejection(probs, drafts[c], sub_reqs[0].params, sub_reqs[0].num_tokens, q)
    return out
