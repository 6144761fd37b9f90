"""Shared-prefix groups (spec key `shared_prefix`, preset `shared-prefix`), as SGLang's
generated shared-prefix dataset: G groups x N prompts; every prompt of a group starts with the
group's system prompt (Ls tokens), then a question of its own (Lq tokens); outputs Lo tokens.
The requests of all groups are shuffled (seeded), as SGLang's are.

The intended prefix-cache hit rate (cached prompt tokens / prompt tokens):
- primed (`--prime`: each system prompt sent once before the run): Ls / (Ls + Lq);
- cold (after `--flush-cache`, no priming): each group's first prompt misses, so
  (N - 1) / N of that.
A server caches whole KV blocks: an Ls that is a multiple of its block size gets the exact rate.
"""

from __future__ import annotations

import numpy as np
from cbbench.workloads.errors import WorkloadError
from cbbench.workloads.spec import RequestSpec, Workload

SHARED_PREFIX_KEYS = ("groups", "prompts_per_group", "system_len", "question_len", "output_len")
SHUFFLE_STREAM = 40


def intended_hit_rates(groups: int, per_group: int, system_len: int, question_len: int) -> dict:
    share = system_len / (system_len + question_len)
    return {"primed": share, "cold": share * (per_group - 1) / per_group}


def build_shared_prefix(spec: object, name: str, seed: int, where: str) -> Workload:
    if not isinstance(spec, dict):
        raise WorkloadError(f"{where}: 'shared_prefix' must be a table")
    for key in spec:
        if key not in SHARED_PREFIX_KEYS:
            raise WorkloadError(
                f"{where}: shared_prefix: unknown key '{key}' "
                f"(keys: {', '.join(SHARED_PREFIX_KEYS)})"
            )
    vals = {}
    for key in SHARED_PREFIX_KEYS:
        v = spec.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise WorkloadError(
                f"{where}: shared_prefix: '{key}' must be an integer >= 1, got {v!r}"
            )
        vals[key] = v
    g, n = vals["groups"], vals["prompts_per_group"]
    ls, lq = vals["system_len"], vals["question_len"]
    order = np.random.default_rng([seed, SHUFFLE_STREAM]).permutation(g * n)
    requests = tuple(
        RequestSpec(
            index=i,
            prompt_len=ls + lq,
            output_len=vals["output_len"],
            prefix_ids=(int(k) // n,),  # one prefix id = the group's whole system prompt
        )
        for i, k in enumerate(order.tolist())
    )
    rates = intended_hit_rates(g, n, ls, lq)
    source = {"format": "shared_prefix", "shared_prefix": vals | {"intended_hit_rate": rates}}
    return Workload(name=name, seed=seed, requests=requests, prefix_block_size=ls, source=source)
