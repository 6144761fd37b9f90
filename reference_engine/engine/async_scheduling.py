"""Async scheduling: build step N+1 while step N computes.

One `LLMEngine.step()` call with `async_scheduling`:

1. (pipeline empty) schedule step N, prepare its inputs, launch it;
2. schedule step N+1 and prepare its inputs *while N computes*: every sequence in N was
   optimistically advanced at launch (its computed tokens counted, and a PLACEHOLDER
   appended where N samples a token), so the scheduler sees the state N will leave;
3. wait for N, apply its tokens (placeholders replaced, stop checks, finished sequences
   released), then fix N+1 up: chunks of sequences that finished (or were aborted) in N are
   dropped (the step is then re-prepared from the now real tokens), otherwise the
   placeholder input rows are patched with N's tokens; launch N+1;
4. return N's outputs, which the caller processes (detokenizes, sends) while N+1 computes.

Why this is safe:
- A request never emits a token past its end: a token is applied only to a sequence that is
  not finished; a sequence that finished in N is dropped from N+1 before N+1 runs.
- Freed blocks are never reused while a step reads them: only a running step reads or
  writes the KV pool, steps run one at a time, and a step that allocates a block freed
  meanwhile (abort, finish, preemption) writes to it only when it runs, after the step that
  read it has finished. An aborted sequence's in-flight step writes only into its last,
  partial block, which is never in the prefix cache (only full computed blocks are).
- The worker thread reads only the prepared snapshot (tensors), never the sequences.
- Greedy outputs are the same with it on and off: each token is computed from the same
  inputs; only when it is applied moves.

Executors: `ModelRunner` runs on one worker thread (torch releases the GIL in its kernels);
`SimExecutor` runs inline and models the overlap in its virtual clock (the per-sequence host
term of the step time hides behind the device time).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cbbench.reference_engine.core.executor import PLACEHOLDER, ScheduledChunk

if TYPE_CHECKING:
    from cbbench.reference_engine.core.outputs import RequestOutput
    from cbbench.reference_engine.core.sequence import Sequence
    from cbbench.reference_engine.scheduler import SchedulerOutput


@dataclass
class _Prepared:
    chunks: list[ScheduledChunk]
    out: SchedulerOutput
    step: Any  # the executor's prepared inputs
    patches: list[tuple[int, Sequence, int]]  # (input row, seq, index of a placeholder)
    schedule_s: float
    scheduled_at: float


@dataclass
class _InFlight:
    prepared: _Prepared
    items: list[tuple[Sequence, bool, int | None]]  # (seq, samples, placeholder index)
    result: Future | list[int | None]
    window: tuple[float, float] | None = None  # set inline; by the worker otherwise


class AsyncPipeline:
    def __init__(self, engine: Any):  # an LLMEngine (not imported: engine.py imports this)
        self.engine = engine
        self.inflight: _InFlight | None = None
        self._pool: ThreadPoolExecutor | None = None

    def usable(self) -> bool:
        """The executor can be split (a wrapper such as simulate.MeasuredClock cannot)."""
        ex = self.engine.executor
        return all(hasattr(ex, n) for n in ("prepare", "patch", "run", "runs_in_thread"))

    # --- one engine step -------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        e = self.engine
        if self.inflight is None:
            first = self._prepare()
            if first is None:
                e._last_chunks = []
                e._idle_since_step()
                return []
            self._launch(first)
        current = self.inflight
        assert current is not None
        nxt = self._prepare()  # overlaps the computation of `current`
        tokens, (start, end) = self._wait(current)
        outputs = e._apply_results(current.items, tokens, end)
        self.inflight = None
        if nxt is not None:
            nxt = self._fix_up(nxt)
        prev_gap = e._gap(start)
        e._last_compute_end = end
        if nxt is not None:
            self._launch(nxt)
        elif not e.seqs:
            e._last_compute_end = None
        p = current.prepared
        e._last_chunks = p.chunks
        e.last_step_window = (start, end)
        e._update_stats(
            len(p.chunks),
            p.out.num_batched_tokens,
            end - min(p.scheduled_at, start),
            p.schedule_s,
            prev_gap,
        )
        return outputs

    # --- internals ---------------------------------------------------------------------
    def _prepare(self, out: SchedulerOutput | None = None) -> _Prepared | None:
        e = self.engine
        now = e.now()
        t0 = time.perf_counter()
        if out is None:
            out = e.scheduler.schedule(now)
        if out.is_empty:
            return None
        chunks = out.chunks
        if e._num_importing:
            e._load_imports(chunks)
        patches: list[tuple[int, Sequence, int]] = []
        row = 0
        for c in chunks:
            seq = c.seq
            # only the last token can be a placeholder (the one the step in flight samples)
            last = seq.num_tokens - 1
            if c.start <= last < c.end and seq.token_ids[last] == PLACEHOLDER:
                patches.append((row + last - c.start, seq, last))
            row += c.num_tokens
        step = e.executor.prepare(chunks)
        return _Prepared(chunks, out, step, patches, time.perf_counter() - t0, now)

    def _fix_up(self, p: _Prepared) -> _Prepared | None:
        """After the step in flight was applied: drop finished sequences, fill placeholders."""
        kept = [c for c in p.chunks if not c.seq.is_finished]
        if len(kept) < len(p.chunks):
            if not kept:
                return None
            p.out.chunks = kept
            p.out.num_batched_tokens = sum(c.num_tokens for c in kept)
            again = self._prepare(p.out)  # the placeholders are real tokens by now
            assert again is not None and not again.patches
            again.schedule_s += p.schedule_s
            again.scheduled_at = p.scheduled_at
            return again
        if p.patches:
            tokens = [seq.token_ids[i] for _, seq, i in p.patches]
            assert PLACEHOLDER not in tokens
            self.engine.executor.patch(p.step, [r for r, _, _ in p.patches], tokens)
            p.patches = []
        return p

    def _launch(self, p: _Prepared) -> None:
        """Start computing p, then advance its sequences as if it had finished."""
        ex = self.engine.executor
        items: list[tuple[Sequence, bool, int | None]] = []
        for c in p.chunks:
            samples = c.samples
            seq = c.seq
            seq.num_computed_tokens += c.num_tokens
            slot = None
            if samples:
                slot = len(seq.token_ids)
                seq.token_ids.append(PLACEHOLDER)
            items.append((seq, samples, slot))
        flight = _InFlight(p, items, [])
        if ex.runs_in_thread:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="cbbench-executor")
            started = threading.Event()
            flight.result = self._pool.submit(_timed_run, ex, p.step, started)
            # Block (releasing the GIL) until the worker runs: otherwise it may wait up to
            # the interpreter's switch interval (5 ms) while this thread keeps the GIL.
            started.wait()
        else:
            start = ex.now()
            flight.result = ex.run(p.step)
            flight.window = (start, ex.now())
        self.inflight = flight

    @staticmethod
    def _wait(f: _InFlight) -> tuple[list[int | None], tuple[float, float]]:
        if isinstance(f.result, Future):
            tokens, window = f.result.result()
            return tokens, window
        assert f.window is not None
        return f.result, f.window


def _timed_run(
    ex: Any, step: Any, started: threading.Event
) -> tuple[list[list[int]], tuple[float, float]]:
    started.set()
    start = ex.now()
    tokens = ex.run(step)
    return tokens, (start, ex.now())
