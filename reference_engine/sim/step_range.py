"""The steps a fit measured: the largest step (tokens computed in one step) and batch
(sequences in one step) among them, kept in the hardware JSON's `fit.measured_steps`. A step
model holds inside what it measured; `cbbench plan` marks a configuration whose token
budget or max_num_seqs allows steps beyond it (harness/planning/extrapolation.py)."""

from __future__ import annotations

from collections.abc import Iterable


def step_range(works: Iterable) -> dict:
    """`works`: StepWork of the measured (or replayed) steps; {} when there are none."""
    tokens = seqs = n = 0
    for w in works:
        tokens, seqs, n = max(tokens, int(w.num_tokens)), max(seqs, int(w.num_seqs)), n + 1
    return {"max_tokens": tokens, "max_seqs": seqs, "steps": n} if n else {}
