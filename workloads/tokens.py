"""The one request -> prompt-token-ids function, shared by HTTP, offline and simulated runs.

A prompt is its shared-prefix blocks followed by ids of its own. Prefix id `p` always expands
to the same `prefix_block_size` ids, so requests that share prefix ids share a real token
prefix, as prefix caching needs. Every id is a pure function of (seed, stream, key,
position): `vocab[h % len(vocab)]` with `h` a splitmix64 hash of the four (stream 1: prefix
block `p`; stream 2: request `index`'s own ids). No generator state: ids for many requests
come out of one set of numpy calls (`many`), and one request's ids are the same whether built
alone or in a batch. The same workload (seed, request index, length, prefix ids) therefore
sends the same ids whether the load generator sends them over HTTP (harness/load/prompts.py), the
engine replays it offline or the simulator does (reference_engine/sim/simulate.py).

(Until December 2026 each request drew from its own seeded PCG64 generator; ids differ from
that version, their distribution does not: uniform over the pool.)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DEFAULT_ID_RANGE = (10, 500)  # valid for every preset model (the smallest vocab has 512 ids)

_GOLDEN = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_MASK = (1 << 64) - 1
_U = np.uint64
_S30, _S27, _S31 = _U(30), _U(27), _U(31)
PREFIX_STREAM, OWN_STREAM = 1, 2


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, element-wise on a uint64 array it may overwrite (products wrap
    mod 2**64)."""
    z ^= z >> _S30
    z *= _U(_M1)
    z ^= z >> _S27
    z *= _U(_M2)
    z ^= z >> _S31
    return z


def _mix_int(z: int) -> int:
    """_mix on one Python int (the same bits)."""
    z ^= z >> 30
    z = (z * _M1) & _MASK
    z ^= z >> 27
    z = (z * _M2) & _MASK
    return z ^ (z >> 31)


def _head(seed: int, stream: int) -> int:
    return _mix_int((seed * 4 + stream) & _MASK)


def hash_ids(
    seed: int, stream: int, keys: Sequence[int], lens: Sequence[int], pool: int
) -> np.ndarray:
    """The definition: for each key k with its length n, in order, h(seed, stream, k, j) %
    pool for j in range(n), as one flat int64 array, where h = mix(mix(head + k * G) + j * G)
    (mix: splitmix64's finalizer; head = mix(4 * seed + stream); G: the golden-ratio constant;
    all mod 2**64)."""
    lens_a = np.asarray(lens, dtype=np.int64)
    total = int(lens_a.sum()) if len(lens_a) else 0
    if total == 0:
        return np.empty(0, dtype=np.int64)
    keys_u = np.asarray(keys, dtype=np.int64).astype(np.uint64)
    base = _mix(keys_u * _U(_GOLDEN) + _U(_head(seed, stream)))
    starts = np.cumsum(lens_a) - lens_a
    pos = (np.arange(total, dtype=np.int64) - np.repeat(starts, lens_a)).astype(np.uint64)
    h = _mix(np.repeat(base, lens_a) + pos * _U(_GOLDEN))
    return (h % _U(pool)).astype(np.int64)


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
        self._pool = _U(len(self.vocab))
        self._own_head = _head(seed, OWN_STREAM)
        self._steps = np.arange(64, dtype=np.uint64) * _U(_GOLDEN)  # j * G, grown on demand
        self._prefix_cache: dict[int, list[int]] = {}

    def _draw(self, stream: int, keys: Sequence[int], lens: Sequence[int]) -> list[int]:
        return self.vocab[hash_ids(self.seed, stream, keys, lens, len(self.vocab))].tolist()

    def _own(self, index: int, n: int) -> list[int]:
        """hash_ids for one request's own ids, with fewer numpy calls (the same values)."""
        if n <= 0:
            return []
        if n > len(self._steps):
            self._steps = np.arange(max(n, 2 * len(self._steps)), dtype=np.uint64) * _U(_GOLDEN)
        base = _mix_int((index * _GOLDEN + self._own_head) & _MASK)
        h = _mix(self._steps[:n] + _U(base))
        return self.vocab[h % self._pool].tolist()

    def _prefix(self, prefix_ids: tuple[int, ...], prompt_len: int) -> list[int]:
        """The prefix blocks' ids, cut to at most prompt_len."""
        missing = [p for p in dict.fromkeys(prefix_ids) if p not in self._prefix_cache]
        if missing:
            n = self.prefix_block_size
            flat = self._draw(PREFIX_STREAM, missing, [n] * len(missing))
            for i, p in enumerate(missing):
                self._prefix_cache[p] = flat[i * n : (i + 1) * n]
        out: list[int] = []
        for p in prefix_ids:
            if len(out) >= prompt_len:
                break
            out += self._prefix_cache[p]
        return out[:prompt_len]

    def many(self, requests: Sequence[tuple[int, int, tuple[int, ...]]]) -> list[list[int]]:
        """Ids for each (index, prompt_len, prefix_ids), as __call__ gives them, with one set
        of numpy calls for the whole batch (~1 us a request instead of ~8)."""
        prefixes = [self._prefix(pre, n) if pre else [] for _, n, pre in requests]
        own = [n - len(pre) for (_, n, _), pre in zip(requests, prefixes, strict=True)]
        flat = self._draw(OWN_STREAM, [r[0] for r in requests], own)
        out, pos = [], 0
        for pre, k in zip(prefixes, own, strict=True):
            out.append(pre + flat[pos : pos + k])
            pos += k
        return out

    def __call__(self, index: int, prompt_len: int, prefix_ids: tuple[int, ...] = ()) -> list[int]:
        """Exactly `prompt_len` ids: prefix blocks (truncated to fit), then request-own ids."""
        if not prefix_ids:  # the common case: ids of its own only
            return self._own(index, prompt_len)
        prefix = self._prefix(prefix_ids, prompt_len)
        ids = prefix + self._own(index, prompt_len - len(prefix))
        assert len(ids) == prompt_len
        return ids


def id_pool(vocab_size: int) -> np.ndarray:
    """DEFAULT_ID_RANGE, cut to a model's vocabulary."""
    lo, hi = DEFAULT_ID_RANGE
    hi = min(hi, vocab_size)
    return np.arange(min(lo, hi - 1), hi, dtype=np.int64)
