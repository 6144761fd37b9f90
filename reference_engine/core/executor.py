"""The boundary between scheduling and computing a step.

The scheduler decides *which* tokens to compute; an executor computes them. Each scheduled
item is a chunk of one sequence: `num_tokens` tokens starting at `seq.num_computed_tokens`
(a whole prompt, a prefill chunk, or the one new token of a decode). When the chunk reaches
the end of the sequence's known tokens, the executor samples the next token for it.

Speculative decoding: a decode chunk may carry `spec_token_ids`, draft tokens appended after
the known ones (their K/V is computed too, into lookahead slots the scheduler reserved). The
executor then scores all of them in the same forward and returns SEVERAL tokens for that
chunk: the accepted draft prefix plus one token of its own (a correction, or a bonus token
when every draft was accepted). So the contract is "a list of new tokens per chunk": empty
when the chunk does not sample, one for a plain decode or prefill end, up to k + 1 with k
drafts.

Executors: `ModelRunner` (real torch model on CPU/CUDA over the paged KV cache) and
`SimExecutor` (no model; advances a virtual clock by a modelled step time and emits tokens).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from cbbench.reference_engine.core.sequence import Sequence

# Async scheduling: the token a running sequence is about to receive from the step in
# flight. It stands in seq.token_ids until that step returns; a prepared step's input row
# holding it is patched with the real token before the step runs.
PLACEHOLDER = -1


class _NoneYet(list):
    """The shared empty list a chunk starts with for its drafts: one per chunk would be an
    allocation per scheduled sequence per step. It refuses in-place changes; a proposer
    assigns a list of its own."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a chunk's drafts start as a shared empty list: assign a new list")

    append = extend = insert = __setitem__ = __iadd__ = __imul__ = _refuse  # type: ignore


NO_DRAFTS: list[Any] = _NoneYet()


class ScheduledChunk:
    """A scheduler creates one per scheduled sequence per step: slots, no default lists."""

    __slots__ = ("seq", "num_tokens", "num_lookahead", "spec_token_ids", "spec_draft_probs")

    def __init__(self, seq: Sequence, num_tokens: int, num_lookahead: int = 0) -> None:
        self.seq = seq
        self.num_tokens = num_tokens  # known tokens to compute, from seq.num_computed_tokens
        self.num_lookahead = num_lookahead  # KV slots reserved past them for draft tokens
        self.spec_token_ids: list[int] = NO_DRAFTS  # drafts (<= num_lookahead)
        # the draft's distribution [V] behind each sampled draft (empty: one-hot drafts)
        self.spec_draft_probs: list[torch.Tensor] = NO_DRAFTS

    def __repr__(self) -> str:
        return (
            f"ScheduledChunk({self.seq.request_id!r}, num_tokens={self.num_tokens}, "
            f"num_lookahead={self.num_lookahead}, spec_token_ids={self.spec_token_ids})"
        )

    @property
    def num_scheduled_tokens(self) -> int:
        """Query rows this chunk puts in the forward: known tokens plus drafts."""
        return self.num_tokens + len(self.spec_token_ids)

    @property
    def start(self) -> int:
        return self.seq.num_computed_tokens

    @property
    def end(self) -> int:
        return self.seq.num_computed_tokens + self.num_tokens

    @property
    def samples(self) -> bool:
        """True when this chunk completes all known tokens, so a new token is sampled."""
        return self.seq.num_computed_tokens + self.num_tokens == len(self.seq.token_ids)


class Executor(Protocol):
    def execute(self, chunks: list[ScheduledChunk]) -> list[list[int]]:
        """Compute the chunks (writing their K/V into the sequences' blocks) and return the
        new tokens of each chunk: [] when it does not `sample`, [token] for a plain chunk that
        does, the accepted drafts plus one token when it carries `spec_token_ids`. Must not
        mutate the sequences: the engine applies the results."""
        ...

    def now(self) -> float:
        """The engine clock in seconds: wall (monotonic) for real executors, virtual for the
        simulator."""
        ...


class SplitExecutor(Executor, Protocol):
    """An executor async scheduling can drive: `execute` split into `prepare` (reads the
    sequences, on the engine thread) and `run` (computes; on a worker thread when
    `runs_in_thread`), with `patch` to fill placeholder input rows in between."""

    runs_in_thread: bool

    def prepare(self, chunks: list[ScheduledChunk]) -> Any: ...

    def patch(self, step: Any, rows: list[int], tokens: list[int]) -> None: ...

    def run(self, step: Any) -> list[list[int]]: ...
