"""Continuous (iteration-level) batching over paged KV, vLLM v1 style.

Each step, with a token budget of `max_num_batched_tokens`:
1. running sequences, most important first, each get the tokens it lacks (1 for a decode,
   the rest of a prompt, or a chunk of it with chunked prefill); KV blocks are allocated on
   demand and when the pool runs dry the least important running sequence is preempted by
   recompute (blocks freed, back to the waiting queue, computed tokens reset, its generated
   tokens kept so the recompute prefills prompt + outputs);
2. waiting sequences are admitted, in queue order (FCFS, or priority with aging), into free
   slots within max_num_seqs, the remaining budget and the free blocks (keeping a watermark),
   with an optional cap on prefills per step. Nothing new is admitted in a step that had to
   preempt, except a request overdue by `max_queue_wait_s`, which is admitted by force,
   preempting the least important running sequences if it must (never another forced one).
   Forced sequences rank above all others from then on, so the order is total and stable
   and the most important sequence always progresses: no preemption ping-pong.
A sequence that finishes frees its slot and blocks at once, so the next step refills it.

Step 1 usually looks only at the running sequences that changed (scheduler/running_batch.py):
the others decode one token with room in their blocks and get last step's chunk again. It
falls back to the loop over every running sequence whenever that could decide differently
(the budget cannot hold every sequence, the pool cannot give every block, lookahead), and
tests/test_sched_due_only.py holds the two to the same schedules.

Adaptive limit (`--max-num-seqs auto`, scheduler/adaptive_limit.py): before each step the
controller reads KV usage, the preemptions of the last step and the queue, and moves the
limit that step 2 admits within (max_num_seqs stays the ceiling). A lowered limit preempts
nobody: admission just waits until running falls under it.

Expert balance (MoE models, `expert_balance`, scheduler/expert_balance.py): when more
requests wait than there are free slots, admission takes, among the next few waiting, the one
whose predicted routing lowers the running batch's expert imbalance most.

Speculative decoding: a running sequence in decode (one token left to compute) also gets up
to `num_speculative_tokens` lookahead slots for draft tokens, allocated with its decode and
charged to the token budget; never more than its max_tokens or max_model_len leave room for.
"""

from __future__ import annotations

from collections.abc import Callable

from cbbench.reference_engine.core.executor import ScheduledChunk
from cbbench.reference_engine.core.sequence import Sequence, SequenceStatus
from cbbench.reference_engine.scheduler.adaptive_limit import AdaptiveLimit
from cbbench.reference_engine.scheduler.base import Scheduler, SchedulerOutput
from cbbench.reference_engine.scheduler.expert_balance import ExpertBalancer
from cbbench.reference_engine.scheduler.queues import RequestQueue, SortKey, priority_key
from cbbench.reference_engine.scheduler.running_batch import RunningBatch

FORCED: SortKey = (float("-inf"),)


class ContinuousScheduler(Scheduler):
    name = "continuous"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        cfg = self.config.continuous
        if cfg.policy == "priority":
            self.waiting = RequestQueue(priority_key(cfg.aging_rate))
        # the running sequences by rank (forced first, then the queue key; ranks are static),
        # with their plain decode chunks and when each must next be looked at
        self._running = RunningBatch()
        self._forced: set[Sequence] = set()  # admitted by max_queue_wait: preempted last
        self.watermark_blocks = int(cfg.watermark * self.block_manager.num_blocks)
        spec = self.config.speculative
        self.num_lookahead = spec.num_speculative_tokens if spec.enabled else 0
        # a proposer that knows its drafts before the step (n-gram lookup) tells how many a
        # sequence will get, so the budget and the lookahead blocks are charged exactly
        self.draft_limit: Callable[[Sequence, int], int] | None = None
        self.balancer: ExpertBalancer | None = None  # set by the engine (expert_balance)
        # --max-num-seqs auto: the running limit follows KV usage (max_num_seqs the ceiling)
        self.adaptive = AdaptiveLimit(cfg.max_num_seqs) if cfg.adaptive_num_seqs else None
        self.num_seqs_limit = cfg.max_num_seqs
        self._preemptions_seen = 0

    def _lookahead(self, seq: Sequence, budget: int) -> int:
        """Draft slots for a decoding seq: within the budget left after its own token, and
        leaving room for the bonus token under max_tokens and max_model_len."""
        n = min(
            self.num_lookahead,
            budget - 1,
            seq.sampling_params.max_tokens - seq.num_output_tokens - 1,
            self.max_model_len - seq.num_tokens - 1,
        )
        if n > 0 and self.draft_limit is not None:
            n = self.draft_limit(seq, n)
        return max(0, n)

    def _rank(self, seq: Sequence) -> tuple:
        return (0 if seq in self._forced else 1, self.waiting.key(seq))

    # --- one step -----------------------------------------------------------------------
    def schedule(self, now: float) -> SchedulerOutput:
        cfg = self.config.continuous
        bm = self.block_manager
        bs = bm.block_size
        max_tokens = cfg.max_num_batched_tokens
        budget = max_tokens
        chunks: list[ScheduledChunk] = []  # one per sequence: a victim's is taken out
        preempted: list[Sequence] = []
        if self.adaptive is not None:  # reads the last step's outcome, before this one
            self.num_seqs_limit = self.adaptive.update(
                bm.num_used_blocks / bm.num_blocks,
                self.num_preemptions - self._preemptions_seen,
                len(self.waiting),
                len(self._running),
            )
            self._preemptions_seen = self.num_preemptions
        limit = self.num_seqs_limit

        def preempt_worst(spare_forced: bool = False) -> Sequence | None:
            candidates = [s for s in self._running if not (spare_forced and s in self._forced)]
            if not candidates:
                return None
            victim = max(candidates, key=self._running.rank.__getitem__)
            nonlocal budget
            if victim.status is SequenceStatus.RUNNING:  # scheduled already? (rare path)
                for i, c in enumerate(chunks):
                    if c.seq is victim:
                        budget += c.num_tokens + c.num_lookahead
                        del chunks[i]
                        break
            self._preempt(victim)
            preempted.append(victim)
            return victim

        # 1. running sequences, most important first: the due ones only when that decides
        # the same as the full loop (running_batch.py), else every one
        due = self._running.next_tick()
        fast = self._decide_due(due, budget) if self._running.synced else None
        if fast is not None:
            chunks, used = fast
            budget -= used
        else:
            budget = self._decide_all(budget, chunks, preempt_worst)

        # 2. waiting sequences
        num_prefills = 0
        balancer, load = self.balancer, None
        if balancer is not None and len(self.waiting) > limit - len(self._running):
            load = balancer.load(self._running)  # more wait than fit: the order matters
        while self.waiting and budget > 0:
            overdue = self._overdue(now)
            seq = overdue or self.waiting.peek()
            if load is not None and overdue is None:
                assert balancer is not None
                seq = balancer.pick(self.waiting, load, set(preempted)) or seq
            forced = overdue is not None
            if seq in preempted:
                break  # never re-admit in the step that preempted it
            if not forced and (
                preempted
                or (cfg.max_prefills_per_step and num_prefills >= cfg.max_prefills_per_step)
            ):
                break
            # an overdue request passes a lowered adaptive limit without preempting anyone,
            # and preempts for a slot only at the ceiling (max_num_seqs), as with a fixed one
            if len(self._running) >= limit and not (
                forced
                and (len(self._running) < cfg.max_num_seqs or preempt_worst(spare_forced=True))
            ):
                break
            if seq.num_external_tokens:  # its prompt's KV arrives from a prefill worker
                computed_blocks, num_cached = [], seq.num_external_tokens
            else:
                computed_blocks = bm.get_computed_blocks(seq)
                num_cached = len(computed_blocks) * bs
            need = seq.num_tokens - num_cached
            if not cfg.enable_chunked_prefill and need > budget:
                break
            n = min(need, budget)
            watermark = self.watermark_blocks if self._running else 0
            while not bm.allocate_slots(seq, num_cached + n, computed_blocks, watermark):
                if not forced or preempt_worst(spare_forced=True) is None:
                    break
                watermark = self.watermark_blocks if self._running else 0
            else:
                self.waiting.remove(seq)
                if forced:
                    self._forced.add(seq)
                seq.status = SequenceStatus.RUNNING
                seq.num_computed_tokens = num_cached
                if seq.metrics.first_scheduled_time is None:
                    seq.metrics.first_scheduled_time = now
                    seq.metrics.num_cached_tokens = 0 if seq.num_external_tokens else num_cached
                self._running.add(seq, self._rank(seq))
                if load is not None:
                    ExpertBalancer.add(load, balancer.share(seq))  # type: ignore[union-attr]
                chunks.append(ScheduledChunk(seq, n))
                budget -= n
                num_prefills += 1
                continue
            break

        # the budget was charged for every token and lookahead slot, refunded for victims;
        # a sequence gets one chunk (running ones once in the order, admitted ones leave
        # the waiting queue)
        out = SchedulerOutput(chunks, preempted, max_tokens - budget)
        assert 0 <= budget <= max_tokens
        assert len(self._running) <= cfg.max_num_seqs
        return out

    def _decide_all(self, budget: int, chunks: list[ScheduledChunk], preempt_worst) -> int:
        """Step 1 over every running sequence (appending to `chunks`); returns the budget
        left. The hot loop of a decode step when the due-only path cannot decide: one token
        each, and a new KV block only every block_size tokens (checked inline)."""
        bm = self.block_manager
        bs = bm.block_size
        lookahead = self.num_lookahead
        running = SequenceStatus.RUNNING
        complete = True  # every running sequence got all it lacks, nobody preempted
        for seq in list(self._running.order):
            if budget == 0:
                complete = False
                break
            if seq.status is not running:
                continue  # preempted as a victim above
            computed = seq.num_computed_tokens
            n = len(seq.token_ids) - computed
            assert n >= 1, f"{seq.request_id} is running with nothing to compute"
            la = self._lookahead(seq, budget) if lookahead and n == 1 else 0  # a decode
            if n > budget:
                n = budget
                complete = False
            need = computed + n + la
            if need > len(seq.block_table) * bs:
                while not bm.allocate_slots(seq, need):
                    complete = False
                    if preempt_worst() is seq:
                        break
                else:
                    chunks.append(ScheduledChunk(seq, n, la))
                    budget -= n + la
                continue
            chunks.append(ScheduledChunk(seq, n, la))
            budget -= n + la
        if complete and not lookahead:  # the due-only path can take over from here
            # a decode: when its next token opens a block; a prefill chunk: next step
            self._running.resync(
                [
                    (c.seq, len(c.seq.block_table) * bs - c.seq.num_tokens + 1)
                    if c.num_tokens == 1
                    else (c.seq, 1)
                    for c in chunks
                ]
            )
        else:
            self._running.resync(None)
        return budget

    def _decide_due(
        self, due: list[Sequence], budget: int
    ) -> tuple[list[ScheduledChunk], int] | None:
        """Step 1 from the due sequences alone: every other running sequence decodes one
        token with room in its blocks (the due steps say so), so it gets its plain chunk.
        None, having changed nothing, when the budget cannot hold every sequence's tokens
        or the pool every block: the full loop then decides (the budget cut, preemption)."""
        rb = self._running
        bm = self.block_manager
        bs = bm.block_size
        demand = len(rb) - len(due)
        grow: list[Sequence] = []  # in rank order, as the full loop allocates
        needs: list[int] = []
        prefills: list[tuple[Sequence, int]] = []
        steps: list[int] = []  # until each must be looked at again
        for seq in due:
            num_tokens = len(seq.token_ids)
            n = num_tokens - seq.num_computed_tokens
            assert n >= 1, f"{seq.request_id} is running with nothing to compute"
            demand += n
            room = len(seq.block_table) * bs - num_tokens
            if room < 0:  # its last token opens a block (or several, for a prefill chunk)
                grow.append(seq)
                needs.append(num_tokens)
                room %= bs
            if n == 1:  # a decode: again when its next token no longer fits
                steps.append(room + 1)
            else:  # a prefill chunk: again next step
                prefills.append((seq, n))
                steps.append(1)
        if demand > budget or (grow and not bm.grow(grow, needs)):
            return None  # (the due steps set are rebuilt by the full loop)
        rb.look_at_each(due, steps)
        chunks = rb.plain.copy()
        for seq, n in prefills:
            chunks[rb.index(seq)] = ScheduledChunk(seq, n)
        return chunks, demand

    def resync(self) -> None:
        """Sequences were advanced without schedule() (event skipping): the next step looks
        at every running sequence."""
        self._running.resync(None)

    def _overdue(self, now: float) -> Sequence | None:
        limit = self.config.continuous.max_queue_wait_s
        if limit is None:
            return None
        oldest = self.waiting.oldest()
        if oldest is not None and now - oldest.metrics.arrival_time >= limit:
            return oldest
        return None

    def _preempt(self, seq: Sequence) -> None:
        self._running.remove(seq)  # a forced sequence stays forced: the order must not flip
        self.block_manager.free(seq, finished=False)
        seq.num_computed_tokens = 0
        seq.num_draft_computed = 0
        seq.status = SequenceStatus.PREEMPTED
        seq.metrics.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.add(seq)

    # --- engine callbacks -------------------------------------------------------------
    def finish(self, seq: Sequence) -> None:
        self._running.remove(seq)
        self._forced.discard(seq)
        self.block_manager.free(seq)

    def abort(self, seq: Sequence) -> None:
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self._running:
            self._running.remove(seq)
        self._forced.discard(seq)
        self.block_manager.free(seq)

    def running(self) -> list[Sequence]:
        return list(self._running)

    def limit_stats(self) -> dict[str, int]:
        a = self.adaptive
        if a is None:
            return super().limit_stats()
        return {
            "num_seqs_limit": self.num_seqs_limit,
            "num_seqs_limit_ups": a.num_up,
            "num_seqs_limit_downs": a.num_down,
        }

    @property
    def num_running(self) -> int:
        return len(self._running)
