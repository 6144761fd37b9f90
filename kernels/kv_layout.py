"""How the CPU torch backend lays out one decode batch's attention, without torch.

`torch_split_kv.plan_split` turns this layout into index tensors; the simulator's cost model
(cost_model.py) counts from it what the step pays: KV tokens read in place,
KV tokens gathered (copied, padded to their group's width) and attention calls. Both must
agree, so both call `split_layout`.

A sequence's blocks split into runs of at least `min_run` consecutive pool ids among its full
blocks (read in place through a view) and the rest, always including the last block
(gathered). Under a quarter of the batch's blocks in place, the backend gathers everything
instead, padded to the longest sequence, a few sequences per call (`gather_calls`).
"""

from __future__ import annotations

from dataclasses import dataclass

# A run is read in place from this many bytes of K (see torch_split_kv for the measurement).
MIN_RUN_BYTES = 64 << 10
# K+V gathered per attention call on CPU: about an L2/L3 share.
GATHER_BYTES = 4 << 20


@dataclass
class SplitLayout:
    runs: list[tuple[int, int, int]]  # (sequence, first pool block, number of blocks)
    rests: list[tuple[int, ...]]  # per sequence: the blocks it gathers (the last included)
    valid: list[int]  # per sequence: valid token positions among its gathered blocks
    groups: list[list[int]]  # sequences gathered and attended together, widest first

    def width(self, group: list[int]) -> int:
        """Blocks each member of `group` gathers, padded to the group's widest."""
        return max(len(self.rests[i]) for i in group)

    def counts(self, block_size: int) -> tuple[int, int, int]:
        """(tokens read in place, token slots gathered incl. padding, attention calls)."""
        in_place = sum(n for _, _, n in self.runs) * block_size
        gathered = sum(len(g) * self.width(g) for g in self.groups) * block_size
        return in_place, gathered, len(self.runs) + len(self.groups)


def split_layout(
    tables: list[list[int]],
    seq_lens: list[int],
    block_size: int,
    block_bytes: int,
    min_run_bytes: int = MIN_RUN_BYTES,
    gather_bytes: int = GATHER_BYTES,
) -> SplitLayout | None:
    """The split of each sequence's blocks into in-place runs and gathered rest, or None when
    too few blocks would be read in place to pay for the extra calls (gather everything). A
    run qualifies from `min_run_bytes` of K (and at least 2 blocks); `block_bytes` is one
    block of K of one layer. The rest is grouped by width, widest first, into groups of
    about `gather_bytes` of K+V each."""
    min_run = max(2, -(-min_run_bytes // block_bytes))
    runs: list[tuple[int, int, int]] = []
    rests: list[tuple[int, ...]] = []
    valid: list[int] = []
    in_place = total = 0
    for b, (row, length) in enumerate(zip(tables, seq_lens, strict=True)):
        assert length >= 1, "a decode sequence has at least its own token"
        nb = -(-length // block_size)
        assert len(row) >= nb, f"sequence {b}: {len(row)} blocks for {length} tokens"
        seq_runs, rest = _pieces(tuple(row[:nb]), min_run)
        runs += [(b, first, n) for first, n in seq_runs]
        in_place += nb - len(rest)
        total += nb
        rests.append(rest)
        valid.append((len(rest) - 1) * block_size + length - (nb - 1) * block_size)
    if not runs or 4 * in_place < total:  # under a quarter in place: not worth it
        return None
    groups: list[list[int]] = []
    order = sorted(range(len(rests)), key=lambda i: len(rests[i]))
    while order:  # widest first: take as many of the widest as fit the budget
        width = len(rests[order[-1]])
        n = max(1, min(len(order), gather_bytes // (2 * width * block_bytes)))
        groups.append(order[-n:])
        order = order[:-n]
    return SplitLayout(runs, rests, valid, groups)


_PIECES: dict[tuple[tuple[int, ...], int], tuple[list[tuple[int, int]], tuple[int, ...]]] = {}
_PIECES_MAX = 1 << 16  # entries: a sequence's pieces change once per block, so memoise them


def _pieces(ids: tuple[int, ...], min_run: int) -> tuple[list[tuple[int, int]], tuple[int, ...]]:
    """One sequence's blocks: runs (first block, count) of >= `min_run` consecutive ids among
    its full blocks ids[:-1], and the rest (the last block always among them)."""
    key = (ids, min_run)
    hit = _PIECES.get(key)
    if hit is not None:
        return hit
    runs: list[tuple[int, int]] = []
    rest: list[int] = []
    nb, start = len(ids), 0
    for i in range(1, nb):
        if i == nb - 1 or ids[i] != ids[i - 1] + 1:
            if i - start >= min_run:
                runs.append((ids[start], i - start))
            else:
                rest.extend(ids[start:i])
            start = i
    rest.append(ids[-1])  # the last block holds the only padding positions
    if len(_PIECES) >= _PIECES_MAX:
        _PIECES.clear()
    _PIECES[key] = out = (runs, tuple(rest))
    return out


def gather_calls(num_seqs: int, padded_len: int, token_bytes: int) -> int:
    """Attention calls of the gather-everything path: sequences padded to `padded_len`
    tokens, as many per call as keep K+V within GATHER_BYTES (`token_bytes`: one token of
    K of one layer)."""
    per_seq = 2 * padded_len * token_bytes
    step = max(1, GATHER_BYTES // max(1, per_seq))
    return -(-num_seqs // step)
