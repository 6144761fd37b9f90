"""N-gram prompt lookup (Saxena 2023; vLLM's `ngram` method): find the latest earlier
occurrence of the context's last n tokens (n from ngram_max down to ngram_min) and propose the
tokens that followed it. No model, no KV: it costs a scan of the context per decoding
sequence, and pays off on outputs that copy from their prompt (summaries, code edits, RAG)."""

from __future__ import annotations

import numpy as np
from cbbench.reference_engine.executor import ScheduledChunk
from numpy.lib.stride_tricks import sliding_window_view


def ngram_lookup(tokens: list[int], ngram_min: int, ngram_max: int, k: int) -> list[int]:
    """Up to k tokens that followed an earlier match of the longest suffix of `tokens`
    (length ngram_max down to ngram_min) that occurs before: the latest match with k tokens
    after it, else the earliest; [] when none occurs."""
    if k < 1 or len(tokens) < ngram_min + 1:
        return []
    arr = np.asarray(tokens, dtype=np.int64)
    n_tok = len(arr)
    for n in range(min(ngram_max, n_tok - 1), ngram_min - 1, -1):
        # windows starting at 0 .. n_tok - n - 1: every occurrence but the suffix itself
        windows = sliding_window_view(arr[:-1], n)
        hits = np.flatnonzero((windows == arr[n_tok - n :]).all(axis=1))
        if hits.size:
            # the latest match followed by k tokens, else the earliest (the longest
            # continuation): in a repeating stretch the latest match ends near the end
            full = hits[hits + n + k <= n_tok]
            start = int(full[-1] if full.size else hits[0]) + n
            return arr[start : start + k].tolist()
    return []


class NgramProposer:
    def __init__(self, ngram_min: int, ngram_max: int) -> None:
        assert 1 <= ngram_min <= ngram_max
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max

    def propose(self, chunks: list[ScheduledChunk]) -> None:
        for c in chunks:
            if c.num_lookahead:
                c.spec_token_ids = ngram_lookup(
                    c.seq.token_ids, self.ngram_min, self.ngram_max, c.num_lookahead
                )
