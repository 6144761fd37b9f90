"""The adaptive running limit of `--max-num-seqs auto`: how many sequences the continuous
scheduler admits up to, moved each step from KV-cache usage and the preemption rate (the
seed's "monitor KV-cache usage continuously and adjust max_batch_size dynamically").

A fixed max_num_seqs that is too high admits every request the free blocks hold at the
moment, then the running sequences' decodes outgrow the pool and are preempted (recompute:
their prefill is paid again); one that is too low leaves KV blocks and batch width unused.
The right number depends on the prompt and output lengths now in flight, so it is found by
feedback, AIMD with a cooldown (TCP congestion control, the KV pool as the link):

- down, multiplicative: a preemption since the last step (the pool overflowed), or KV usage
  above `high` (it is about to: decodes add a block every block_size tokens)
  -> limit = max(1, floor(min(limit, running) * beta)). Cut from the running count, not from
  the limit, when the limit was not what bound the batch: the overflow shows what fits.
- up, additive: KV usage below `low` while requests wait and the limit is what keeps them
  out (running >= limit) -> limit + step. Raising while the batch is under the limit, or
  with nobody waiting, would change nothing and only lose the memory of the last cut.
- cooldown: after a decision, `cooldown_steps` steps without one, so the batch can follow
  (a lowered limit is reached only as sequences finish) before the next reading counts.

Multiplicative down and additive up: an overflow costs a recompute of whole prompts, a
sequence short costs one slot of batch width, so back off fast and probe slowly; the limit
then oscillates in a narrow band under the pool's capacity instead of at its edge.
The defaults (high 0.98, low 0.90, beta 0.85, step ceiling/32, cooldown 8 steps) were
chosen on the simulator (llama-3-8b, h100-sxm, workload mixed, 1/2/4 GiB of KV): lower
marks or a deeper cut preempt less still but give up 2-8 % of output tok/s against the best
fixed limit; these keep its tok/s within 1 % with 1.7-5x fewer preemptions
(docs/quantization.md, "Adaptive batch limit").

The controller only answers a number: the scheduler admits nobody while running >= limit,
and never preempts to enforce a lowered limit (running sequences keep their blocks and
finish; the batch shrinks as they do). The limit stays within [1, ceiling] (asserted), the
ceiling being max_num_seqs, which every capacity (CUDA-graph sizes, batch slots) reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AdaptiveLimit:
    ceiling: int  # max_num_seqs: the hard cap, and the starting limit
    high: float = 0.98  # KV usage above this lowers the limit
    low: float = 0.90  # KV usage below this (with requests waiting) raises it
    beta: float = 0.85  # the multiplicative cut
    step: int = 0  # the additive raise (0: max(1, ceiling // 32))
    cooldown_steps: int = 8  # steps after a decision before the next
    limit: int = field(init=False)
    num_up: int = field(default=0, init=False)  # decisions so far, by direction
    num_down: int = field(default=0, init=False)
    _cooldown: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        assert self.ceiling >= 1, self.ceiling
        assert 0.0 < self.low < self.high <= 1.0, (self.low, self.high)
        assert 0.0 < self.beta < 1.0, self.beta
        assert self.step >= 0 and self.cooldown_steps >= 0
        self.step = self.step or max(1, self.ceiling // 32)
        self.limit = self.ceiling

    def update(
        self, kv_usage: float, num_preempted: int, num_waiting: int, num_running: int
    ) -> int:
        """One step's reading -> the limit to admit within. `num_preempted`: preemptions
        since the last update; `kv_usage`: used / total KV blocks now."""
        assert 0.0 <= kv_usage <= 1.0 + 1e-9, kv_usage
        assert num_preempted >= 0 and num_waiting >= 0 and num_running >= 0
        if self._cooldown > 0:
            self._cooldown -= 1
        elif num_preempted or kv_usage > self.high:
            new = max(1, int(min(self.limit, num_running) * self.beta))
            if new < self.limit:
                self.num_down += 1
                self._set(new)
        elif kv_usage < self.low and num_waiting and num_running >= self.limit:
            new = min(self.ceiling, self.limit + self.step)
            if new > self.limit:
                self.num_up += 1
                self._set(new)
        assert 1 <= self.limit <= self.ceiling, (self.limit, self.ceiling)
        return self.limit

    def _set(self, limit: int) -> None:
        self.limit = limit
        self._cooldown = self.cooldown_steps
