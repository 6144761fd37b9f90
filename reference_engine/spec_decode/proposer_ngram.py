"""N-gram prompt lookup (Saxena 2023; vLLM's `ngram` method): find the latest earlier
occurrence of the context's last n tokens (n from ngram_max down to ngram_min) and propose the
tokens that followed it. No model, no KV: it costs a scan of the context per decoding
sequence, and pays off on outputs that copy from their prompt (summaries, code edits, RAG)."""

from __future__ import annotations

import numpy as np
from cbbench.reference_engine.core.executor import ScheduledChunk
from cbbench.reference_engine.core.sequence import Sequence
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
    """Drafts depend on the tokens only, so they are known at scheduling time:
    `max_drafts` (the scheduler's draft_limit) looks them up, and `propose` hands out the
    same lookup, so the token budget and lookahead blocks are charged for real drafts."""

    def __init__(self, ngram_min: int, ngram_max: int) -> None:
        assert 1 <= ngram_min <= ngram_max
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self._looked_up: dict[str, tuple[int, list[int]]] = {}  # id -> (num_tokens, drafts)

    def _lookup(self, seq: Sequence, k: int) -> list[int]:
        hit = self._looked_up.get(seq.request_id)
        if hit is not None and hit[0] == seq.num_tokens and len(hit[1]) >= k:
            return hit[1][:k]
        drafts = ngram_lookup(seq.token_ids, self.ngram_min, self.ngram_max, k)
        self._looked_up[seq.request_id] = (seq.num_tokens, drafts)
        return drafts

    def max_drafts(self, seq: Sequence, k: int) -> int:
        return len(self._lookup(seq, k))

    def propose(self, chunks: list[ScheduledChunk]) -> None:
        for c in chunks:
            if c.num_lookahead:
                c.spec_token_ids = self._lookup(c.seq, c.num_lookahead)
        live = {c.seq.request_id for c in chunks}
        for rid in [r for r in self._looked_up if r not in live]:
            del self._looked_up[rid]  # finished, preempted or not scheduled: look up again
