"""One module per rule; RULES lists them in the order findings are shown.

Layer: diagnose (its rules).
"""

from __future__ import annotations

from cbbench.harness.diagnose.base import Rule
from cbbench.harness.diagnose.rules import (
    agent_cache,
    client_bound,
    errors,
    expert_imbalance,
    fanout_queue,
    hol_blocking,
    kv_pressure,
    length_skew,
    low_utilization,
    pd_interference,
    prefill_stall,
    queue_delay,
    reasoning_wait,
    replica_imbalance,
    scheduling_delay,
    session_cache,
)

RULES: tuple[Rule, ...] = (
    client_bound.RULE,
    errors.RULE,
    kv_pressure.RULE,
    low_utilization.BATCH_CAP,
    low_utilization.LOW_CONCURRENCY,
    hol_blocking.RULE,
    queue_delay.RULE,
    prefill_stall.RULE,
    pd_interference.RULE,
    scheduling_delay.RULE,
    length_skew.RULE,
    session_cache.RULE,
    replica_imbalance.RULE,
    expert_imbalance.RULE,
    agent_cache.RULE,
    fanout_queue.RULE,
    reasoning_wait.RULE,
)
