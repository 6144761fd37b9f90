"""The one request -> prompt-token-ids function, shared by HTTP, offline and simulated runs.

A prompt is its shared-prefix blocks followed by ids of its own. Prefix id `p` always expands
to the same `prefix_block_size` ids (drawn from a generator seeded with (seed, 1, p)), so
requests that share prefix ids share a real token prefix, as prefix caching needs; a
request's own ids come from (seed, 2, index). The same workload (seed, request index, length,
prefix ids) therefore sends the same ids whether the load generator sends them over HTTP
(harness/prompts.py), the engine replays it offline or the simulator does
(reference_engine/simulate.py).
"""

from __future__ import annotations

import numpy as np

DEFAULT_ID_RANGE = (10, 500)  # valid for every preset model (the smallest vocab has 512 ids)


class PromptTokenIds:
    """Prompt ids for a workload's requests; `vocab` is the pool ids are drawn from (default:
    DEFAULT_ID_RANGE; a tokenizer's single-token words for text prompts)."""

    def __init__(
        self, seed: int = 0, prefix_block_size: int = 512, vocab: np.ndarray | None = None
    ) -> None:
        assert prefix_block_size > 0
        self.seed = seed
        self.prefix_block_size = prefix_block_size
        self.vocab = np.arange(*DEFAULT_ID_RANGE, dtype=np.int64) if vocab is None else vocab
        assert len(self.vocab) > 0
        self._prefix_cache: dict[int, np.ndarray] = {}

    def _draw(self, key: tuple[int, ...], n: int) -> np.ndarray:
        # default_rng's own construction, spelled out: the same generator at half the cost
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence((self.seed, *key))))
        return self.vocab[rng.integers(0, len(self.vocab), size=n)]

    def __call__(self, index: int, prompt_len: int, prefix_ids: tuple[int, ...] = ()) -> list[int]:
        """Exactly `prompt_len` ids: prefix blocks (truncated to fit), then request-own ids."""
        if not prefix_ids:  # the common case: ids of its own only
            return self._draw((2, index), prompt_len).tolist()
        parts = []
        for p in prefix_ids:
            if p not in self._prefix_cache:
                self._prefix_cache[p] = self._draw((1, p), self.prefix_block_size)
            parts.append(self._prefix_cache[p])
        prefix = np.concatenate(parts)[:prompt_len] if parts else np.empty(0, dtype=np.int64)
        own = self._draw((2, index), prompt_len - len(prefix))
        ids = np.concatenate([prefix, own])
        assert len(ids) == prompt_len
        return ids.tolist()


def id_pool(vocab_size: int) -> np.ndarray:
    """DEFAULT_ID_RANGE, cut to a model's vocabulary."""
    lo, hi = DEFAULT_ID_RANGE
    hi = min(hi, vocab_size)
    return np.arange(min(lo, hi - 1), hi, dtype=np.int64)
