"""Pick the next token from each sampling row's logits: greedy, or temperature / top-k / top-p.

A request with a `seed` draws from its own generator, re-seeded from (seed, index of the token
being sampled), so it gets the same tokens whatever else is in the batch, and again after a
preemption recomputes it. Unseeded requests share the runner's generator.

While a request has fewer than `min_tokens` outputs, its stop tokens (EOS unless
`ignore_eos`, and `stop_token_ids`) are masked out, so the engine never has to stop early.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from cbbench.kernels import cpu_ops
from cbbench.reference_engine.core.outputs import TokenLogprob
from cbbench.reference_engine.sampling_params import SamplingParams

_SEED_MIX = 0x9E3779B97F4A7C15  # spreads (seed, step) over the generator's seed space


@dataclass
class SampleRequest:
    params: SamplingParams
    num_tokens: int  # tokens of the sequence so far; the sampled one gets this index
    num_output_tokens: int


class Sampler:
    def __init__(self, eos_token_ids: tuple[int, ...], device: torch.device, seed: int = 0):
        self.eos_token_ids = eos_token_ids
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self._row_generator = torch.Generator(device=device)
        self._cpu: bool | None = None  # decided on first use (builds the CPU kernels)

    def __call__(self, logits: torch.Tensor, reqs: list[SampleRequest]) -> list[int]:
        """logits [N, V] fp32, one row per request -> N token ids."""
        assert logits.shape[0] == len(reqs)
        self._mask_stop_tokens(logits, reqs)
        if all(r.params.greedy for r in reqs):
            return self._argmax(logits).tolist()
        rows = [i for i, r in enumerate(reqs) if not r.params.greedy]
        u = torch.empty(len(rows), 1, dtype=torch.float64, device=logits.device)
        unseeded = [j for j, i in enumerate(rows) if reqs[i].params.seed is None]
        if len(unseeded) == len(rows):  # the same draws as through the index below
            u.uniform_(generator=self.generator)
        elif unseeded:
            u[unseeded] = u[unseeded].uniform_(generator=self.generator)
        for j, i in enumerate(rows):
            seed = reqs[i].params.seed
            if seed is not None:
                step_seed = (seed * _SEED_MIX + reqs[i].num_tokens) % (1 << 63)
                self._row_generator.manual_seed(step_seed)
                u[j].uniform_(generator=self._row_generator)
        drawn = self._draw(logits, rows, [reqs[i].params for i in rows], u)
        if len(rows) == len(reqs):
            return drawn
        out = self._argmax(logits).tolist()
        for j, i in enumerate(rows):
            out[i] = drawn[j]
        return out

    def _draw(
        self, logits: torch.Tensor, rows: list[int], params: list[SamplingParams], u: torch.Tensor
    ) -> list[int]:
        """One token from each of `rows` by inverse CDF at u [R, 1]. Rows at a temperature
        alone (no top-k / top-p) on fp32 CPU logits go through kernels/cpu_ops in one call
        (8 x 32k rows: ~0.1 ms against ~1-3 ms of torch ops; same picks but for rounding at
        a boundary); the rest, and rows the kernel declines (NaN, +inf), through torch."""
        vocab = logits.shape[-1]
        plain = all((p.top_k == -1 or p.top_k >= vocab) and p.top_p == 1.0 for p in params)
        if plain and self._cpu_kernels() and logits.dtype == torch.float32 and logits.dim() == 2:
            temps = [p.temperature for p in params]
            drawn = cpu_ops.sample_rows(logits, rows, temps, u[:, 0].tolist())
            declined = [j for j, t in enumerate(drawn) if t < 0]
            if declined:
                probs = self._probs(
                    logits[[rows[j] for j in declined]], [params[j] for j in declined]
                )
                for j, t in zip(declined, inverse_cdf(probs, u[declined]).tolist(), strict=True):
                    drawn[j] = t
            return drawn
        return inverse_cdf(self._probs(logits[rows], params), u).tolist()

    def _argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """Greedy picks; fp32 CPU logits through kernels/cpu_ops (torch's argmax over
        8 x 32k rows took ~400 us on one thread, the C++ one ~20 us; same indices)."""
        if self._cpu_kernels() and logits.dtype == torch.float32 and logits.dim() == 2:
            return cpu_ops.argmax_rows(logits)
        return logits.argmax(dim=-1)

    def _cpu_kernels(self) -> bool:
        if self._cpu is None:
            self._cpu = self.device.type == "cpu" and cpu_ops.available()
        return self._cpu

    def _mask_stop_tokens(self, logits: torch.Tensor, reqs: list[SampleRequest]) -> None:
        for i, r in enumerate(reqs):
            p = r.params
            if r.num_output_tokens < p.min_tokens:
                stops = list(p.stop_token_ids) + ([] if p.ignore_eos else list(self.eos_token_ids))
                if stops:
                    logits[i, stops] = float("-inf")

    @staticmethod
    def _probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """Row-wise temperature, then top-k, then top-p -> probabilities [n, V]."""
        temps = torch.tensor([p.temperature for p in params], device=logits.device)
        logits = logits / temps[:, None]
        top_ks = [p.top_k for p in params]
        top_ps = [p.top_p for p in params]
        if any(k > 0 for k in top_ks) or any(p < 1.0 for p in top_ps):
            vocab = logits.shape[-1]
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            # a top_k past the vocabulary is all of it (and stays within int64)
            ks = torch.tensor([min(k, vocab) if k > 0 else vocab for k in top_ks],
                              device=logits.device)  # fmt: skip
            rank = torch.arange(vocab, device=logits.device)
            drop = rank[None, :] >= ks[:, None]
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            sorted_probs = sorted_logits.softmax(dim=-1)
            ps = torch.tensor(top_ps, device=logits.device)
            # drop a token when the mass before it already reaches top_p (the first always stays)
            before = sorted_probs.cumsum(dim=-1) - sorted_probs
            sorted_logits = sorted_logits.masked_fill(before >= ps[:, None], float("-inf"))
            logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
        return logits.softmax(dim=-1)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """probs [n, V] (rows need not sum to 1), u [n, 1] uniform in [0, 1) -> [n] token ids
    drawn from each row: the first token whose cumulative mass reaches (1 - u) * total. One
    random number per row (an exponential race needs one per vocabulary entry: measured 5.5 ms
    against 0.2 ms for 8 x 32k rows on one CPU thread). The target lies in (0, total], so a
    token of zero probability is never picked; float64 sums keep the tail tokens' odds."""
    cdf = probs.to(torch.float64).cumsum_(dim=-1)
    target = (1.0 - u) * cdf[:, -1:]
    return torch.searchsorted(cdf, target)[:, 0].clamp_(max=probs.shape[-1] - 1)


def token_logprobs(logprobs: torch.Tensor, token_ids: list[int], top_k: int) -> list[TokenLogprob]:
    """logprobs [n, V] (log-softmax rows), the token picked at each row -> TokenLogprob each:
    the token's logprob and rank, and the top_k alternatives."""
    assert logprobs.shape[0] == len(token_ids)
    idx = torch.tensor(token_ids, device=logprobs.device)
    chosen = logprobs.gather(1, idx[:, None])[:, 0]
    ranks = (logprobs > chosen[:, None]).sum(dim=1) + 1
    top_vals, top_ids = logprobs.topk(top_k, dim=1) if top_k else (None, None)
    out = []
    for r, tok in enumerate(token_ids):
        top = []
        if top_ids is not None:
            top = list(zip(top_ids[r].tolist(), top_vals[r].tolist(), strict=True))
        out.append(TokenLogprob(tok, float(chosen[r]), int(ranks[r]), top))
    return out
