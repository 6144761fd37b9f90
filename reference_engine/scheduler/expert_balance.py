"""Expert-balance admission for MoE models (the continuous scheduler's `expert_balance`).

When more requests wait than there are free slots, the order of admission decides which
requests decode together, hence how their tokens spread over the experts. Each sequence's
routing is predicted by the executor (`histogram(seq)`: tokens per expert, any scale; None
when unknown, counted as uniform): a running sequence's from its last step, a waiting one's
from its prompt (ModelRunner: a per-token table learned from real routing; simulator: the
routing seen so far for its topic). The running batch's load is the sum of its members'
normalised histograms (one decode token each); among the first `window` waiting sequences
the balancer admits the one that minimises max / mean of the load it would make, ties going
to queue order. Beyond the window, and for requests forced by max_queue_wait, the queue
order stands, so no request is passed over indefinitely by more than `window - 1` others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from cbbench.reference_engine.core.sequence import Sequence

Histogram = Callable[[Sequence], "list[float] | None"]


def normalised(hist: list[float] | None, num_experts: int) -> list[float]:
    """A histogram scaled to sum 1 (uniform when unknown or empty)."""
    total = sum(hist) if hist else 0.0
    if not hist or total <= 0:
        return [1.0 / num_experts] * num_experts
    assert len(hist) == num_experts, f"{len(hist)} experts in a histogram of {num_experts}"
    return [h / total for h in hist]


def imbalance(load: list[float]) -> float:
    """max / mean (1 = balanced)."""
    total = sum(load)
    return max(load) * len(load) / total if total > 0 else 1.0


class ExpertBalancer:
    def __init__(self, histogram: Histogram, num_experts: int, window: int) -> None:
        assert num_experts >= 1 and window >= 1
        self.histogram = histogram
        self.num_experts = num_experts
        self.window = window
        self.num_reordered = 0  # admissions that were not the queue's head (a stat for tests)

    def share(self, seq: Sequence) -> list[float]:
        return normalised(self.histogram(seq), self.num_experts)

    def load(self, running: Iterable[Sequence]) -> list[float]:
        load = [0.0] * self.num_experts
        for seq in running:
            for e, v in enumerate(self.share(seq)):
                load[e] += v
        return load

    def pick(self, waiting: Iterable[Sequence], load: list[float], skip: set) -> Sequence | None:
        """The best of the first `window` waiting sequences not in `skip` (None: none)."""
        best: Sequence | None = None
        best_score = float("inf")
        head = True
        seen = 0
        for seq in waiting:
            if seq in skip:
                continue
            seen += 1
            share = self.share(seq)
            score = imbalance([a + b for a, b in zip(load, share, strict=True)])
            if score < best_score - 1e-9:
                best, best_score = seq, score
                head = seen == 1
            if seen >= self.window:
                break
        if best is not None and not head:
            self.num_reordered += 1
        return best

    @staticmethod
    def add(load: list[float], share: list[float]) -> None:
        for e, v in enumerate(share):
            load[e] += v
