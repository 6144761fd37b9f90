"""Applying a computed step to the engine's sequences (the "update" of schedule -> execute
-> update): computed tokens, new tokens, stop checks, finished requests released, outputs.

A mixin of LLMEngine: it reads and changes the engine's `block_manager`, `scheduler`,
`seqs`, `executor`, `spec_stats` and `num_steps`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cbbench.reference_engine.core.executor import PLACEHOLDER, ScheduledChunk
from cbbench.reference_engine.core.outputs import RequestOutput
from cbbench.reference_engine.core.sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from cbbench.reference_engine.core.block_manager import BlockManager
    from cbbench.reference_engine.core.executor import Executor
    from cbbench.reference_engine.core.spec_decode_stats import SpecDecodeStats
    from cbbench.reference_engine.scheduler.base import Scheduler


class StepUpdate:
    block_manager: BlockManager
    scheduler: Scheduler
    seqs: dict[str, Sequence]
    executor: Executor
    spec_stats: SpecDecodeStats | None
    num_steps: int

    def _apply_results(
        self, items: list[tuple[Sequence, bool, int | None]], tokens: list[list[int]], end: float
    ) -> list[RequestOutput]:
        """Async scheduling: apply a computed step. `items` are (seq, samples, index in
        seq.token_ids of the placeholder its token replaces) per chunk; num_computed_tokens
        was advanced at launch. Aborted sequences are skipped; a finished one is released
        from wherever it is (running, or waiting after a preemption)."""
        outputs: list[RequestOutput] = []
        bm = self.block_manager
        self.num_steps += 1
        # this step's (the next one is launched only after this returns)
        logprobs = getattr(self.executor, "last_logprobs", None) or {}
        for (seq, samples, slot), toks in zip(items, tokens, strict=True):
            assert bool(toks) == samples and len(toks) <= 1, f"{seq.request_id}: bad result"
            if seq.is_finished:
                continue  # aborted while its step computed
            if not toks:
                bm.cache_blocks(seq)
                continue
            assert slot == len(seq.token_ids) - 1 and seq.token_ids[slot] == PLACEHOLDER
            tok = toks[0]
            seq.token_ids[slot] = tok
            if seq.metrics.first_token_time is None:
                seq.metrics.first_token_time = end
            bm.cache_blocks(seq)
            reason = self._stop_reason(seq, tok)
            if reason is not None:
                self._finish(seq, reason, end)
            output = self._output(seq, [tok], reason)
            if seq.request_id in logprobs:
                output.logprobs = logprobs[seq.request_id][:1]
            output.embedding = getattr(self.executor, "last_embeddings", {}).get(seq.request_id)
            outputs.append(output)
        return outputs

    def _finish(self, seq: Sequence, reason: str, end: float) -> None:
        running = seq.status is SequenceStatus.RUNNING
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.metrics.finished_time = end
        del self.seqs[seq.request_id]
        if seq.kv_export and running:  # a prefill worker's: ship the prompt's KV first
            self._export_kv(seq)  # type: ignore[attr-defined]
        if running:
            self.scheduler.finish(seq)
        else:  # async scheduling: preempted while its last token computed
            self.scheduler.abort(seq)

    @staticmethod
    def _output(seq: Sequence, new: list[int], reason: str | None) -> RequestOutput:
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=new,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            finished=reason is not None,
            finish_reason=reason,
            metrics=seq.metrics,
        )

    def _apply(
        self, chunks: list[ScheduledChunk], tokens: list[list[int]], end: float
    ) -> list[RequestOutput]:
        """Apply a computed step: computed tokens, new tokens, stops; the step's outputs.
        The plain chunk (no lookahead: 0 or 1 token) is inlined, as this loop runs for every
        scheduled sequence of every step."""
        bm = self.block_manager
        caching = bm.enable_prefix_caching
        outputs: list[RequestOutput] = []
        for chunk, toks in zip(chunks, tokens, strict=True):
            if chunk.num_lookahead:
                outputs.append(self._apply_speculative(chunk, toks, end))
                continue
            seq = chunk.seq
            token_ids = seq.token_ids
            computed = seq.num_computed_tokens + chunk.num_tokens
            seq.num_computed_tokens = computed
            if not toks:
                assert computed < len(token_ids), f"{seq.request_id}: executor/sample mismatch"
                if caching:
                    bm.cache_blocks(seq)
                continue
            assert computed == len(token_ids) and len(toks) == 1, f"{seq.request_id}: bad result"
            tok = toks[0]
            token_ids.append(tok)
            num_tokens = computed + 1
            metrics = seq.metrics
            if metrics.first_token_time is None:
                metrics.first_token_time = end
            if caching:
                bm.cache_blocks(seq)
            num_prompt = len(seq.prompt_token_ids)
            reason = None
            if tok in seq.stop_token_ids and (
                num_tokens - num_prompt >= seq.sampling_params.min_tokens
            ):
                reason = "stop"
            elif num_tokens >= seq.max_num_tokens:
                reason = "length"
            if reason is not None:
                self._finish(seq, reason, end)
            # positional (RequestOutput's field order): keywords cost twice as much here
            outputs.append(
                RequestOutput(
                    seq.request_id,
                    toks,
                    num_prompt,
                    num_tokens - num_prompt,
                    reason is not None,
                    reason,
                    metrics,
                )
            )
        return outputs

    def _apply_speculative(self, chunk: ScheduledChunk, toks: list[int], end: float):
        """A decode chunk with lookahead slots: accepted drafts, then one token of its own."""
        seq, bm = chunk.seq, self.block_manager
        assert bool(toks) == chunk.samples, f"{seq.request_id}: executor/sample mismatch"
        seq.num_computed_tokens += chunk.num_tokens
        num_draft = len(chunk.spec_token_ids)
        num_accepted = len(toks) - 1
        assert (
            0 <= num_accepted <= num_draft and toks[:-1] == chunk.spec_token_ids[:num_accepted]
        ), f"{seq.request_id}: executor returned tokens that are not an accepted prefix"
        seq.num_computed_tokens += num_accepted  # accepted drafts have their K/V
        if num_draft and self.spec_stats is not None:
            self.spec_stats.observe(num_draft, num_accepted)
            seq.metrics.num_draft_tokens += num_draft
            seq.metrics.num_accepted_tokens += num_accepted
        reason = None
        new: list[int] = []
        for tok in toks:
            seq.token_ids.append(tok)
            new.append(tok)
            reason = self._stop_reason(seq, tok)
            if reason is not None:
                break
        # rejected drafts' K/V is stale: computed counts only kept tokens, lookahead blocks
        # beyond them go back to the pool (prefix-cache hashes cover computed tokens only)
        seq.num_computed_tokens = min(seq.num_computed_tokens, seq.num_tokens - 1)
        seq.num_draft_computed = min(seq.num_draft_computed, seq.num_computed_tokens)
        bm.trim(seq, seq.num_tokens)
        if seq.metrics.first_token_time is None:
            seq.metrics.first_token_time = end
        bm.cache_blocks(seq)
        if reason is not None:
            self._finish(seq, reason, end)
        return self._output(seq, new, reason)

    @staticmethod
    def _stop_reason(seq: Sequence, tok: int) -> str | None:
        """Why seq ends with `tok` just appended (None: it goes on)."""
        if (
            tok in seq.stop_token_ids
            and len(seq.token_ids) - len(seq.prompt_token_ids) >= seq.sampling_params.min_tokens
        ):
            return "stop"
        if len(seq.token_ids) >= seq.max_num_tokens:
            return "length"
        return None
