"""The boundary between scheduling and computing a step.

The scheduler decides *which* tokens to compute; an executor computes them. Each scheduled
item is a chunk of one sequence: `num_tokens` tokens starting at `seq.num_computed_tokens`
(a whole prompt, a prefill chunk, or the one new token of a decode). When the chunk reaches
the end of the sequence's known tokens, the executor samples the next token for it.

Executors: `ModelRunner` (real torch model on CPU/CUDA over the paged KV cache) and
`SimExecutor` (no model; advances a virtual clock by a modelled step time and emits tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from cbbench.reference_engine.sequence import Sequence


@dataclass
class ScheduledChunk:
    seq: Sequence
    num_tokens: int  # tokens to compute this step, from seq.num_computed_tokens on

    @property
    def start(self) -> int:
        return self.seq.num_computed_tokens

    @property
    def end(self) -> int:
        return self.seq.num_computed_tokens + self.num_tokens

    @property
    def samples(self) -> bool:
        """True when this chunk completes all known tokens, so a new token is sampled."""
        return self.end == len(self.seq.token_ids)


class Executor(Protocol):
    def execute(self, chunks: list[ScheduledChunk]) -> list[int | None]:
        """Compute the chunks (writing their K/V into the sequences' blocks) and return one
        sampled token per chunk that `samples`, None for the others. Must not mutate the
        sequences: the engine applies the results."""
        ...

    def now(self) -> float:
        """The engine clock in seconds: wall (monotonic) for real executors, virtual for the
        simulator."""
        ...
