"""Engine-wide speculative decoding counters (vLLM's spec_decode metrics)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass
class SpecDecodeStats:
    num_spec_tokens: int  # k: drafts per sequence per step at most
    num_drafts: int = 0  # verified proposals (one per sequence per step that drafted)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)  # [k]: drafts accepted at pos i

    def __post_init__(self) -> None:
        if not self.accepted_per_pos:
            self.accepted_per_pos = [0] * self.num_spec_tokens

    def observe(self, num_draft: int, num_accepted: int) -> None:
        assert 0 <= num_accepted <= num_draft <= self.num_spec_tokens
        if not num_draft:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        for i in range(num_accepted):
            self.accepted_per_pos[i] += 1

    def snapshot(self) -> SpecDecodeStats:
        return replace(self, accepted_per_pos=list(self.accepted_per_pos))

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens emitted per verified proposal: accepted drafts + the target's own token."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None
