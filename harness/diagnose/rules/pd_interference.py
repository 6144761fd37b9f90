"""Prefill-decode interference on an aggregated server: the ITL tail is made of the steps
that computed long prompts. The worst token gaps of running streams (those at or above ITL
p99) fall, most of them, inside a long prompt's prefill (sent -> its first token), and they
are many times the median gap: long prompts inflate ITL p99 while short ones do not.
Whichever way a step budget splits a prompt, the streams sharing its engine wait for it;
the remedies are a finer split (chunked prefill with a smaller budget, which trades prompt
throughput) or moving prefill off the decoding workers (P/D disaggregation,
docs/disaggregation.md). Silent for a disaggregated server (its records carry phases) and
for run-to-completion schedulers (a prompt never joins a running stream there)."""

from __future__ import annotations

import numpy as np
from cbbench.harness.diagnose.base import Finding, Rule, RunView, ms
from cbbench.harness.diagnose.fixes import fixes_for
from cbbench.harness.diagnose.slots import RUN_TO_COMPLETION

TAIL_RATIO = 4.0  # ITL p99 / ITL p50, at or above: a tail worth explaining
LONG = 4.0  # a prompt this many times the p25 prompt (and >= MIN_LONG_TOKENS) is long
MIN_LONG_TOKENS = 256
MIN_LONG = 3
SHARE = 0.5  # of the tail gaps inside a long prefill, at or above: interference
MIN_TAIL = 5


def check(v: RunView) -> Finding | None:
    if v.scheduler in RUN_TO_COMPLETION or any("phases" in r.extra for r in v.ok):
        return None
    prompts = {r.id: v.prompt_tokens(r) for r in v.ok}
    if len(prompts) < 2 * MIN_LONG:
        return None
    cut = max(LONG * float(np.percentile(list(prompts.values()), 25)), MIN_LONG_TOKENS)
    windows = sorted(
        (r.sent_s, r.first_token_s) for r in v.ok
        if prompts[r.id] >= cut and r.sent_s is not None and r.first_token_s is not None
    )  # fmt: skip
    if len(windows) < MIN_LONG:
        return None
    gaps = [(a, b) for r in v.streams if prompts.get(r.id, 0) < cut
            for a, b in zip(r.token_times_s, r.token_times_s[1:], strict=False) if b > a]  # fmt: skip
    if len(gaps) < 20 * MIN_TAIL:
        return None
    sizes = np.array([b - a for a, b in gaps])
    p50, p99 = float(np.median(sizes)), float(np.percentile(sizes, 99))
    if p99 < TAIL_RATIO * p50:
        return None
    tail = [(a, b) for a, b in gaps if b - a >= p99]
    inside = [g for g in tail if any(s < g[1] and g[0] < e for s, e in windows)]
    share = len(inside) / max(1, len(tail))
    if len(tail) < MIN_TAIL or share < SHARE:
        return None
    long_lens = [p for p in prompts.values() if p >= cut]
    return Finding(
        rule=RULE.id,
        title="long prompts inflate ITL p99 (prefill-decode interference)",
        cause="this server computes prompts on the same engine as the decoding streams: each "
        "long prompt's prefill steps stall every stream beside it, and those stalls are the "
        "ITL tail",
        evidence=[
            f"ITL of the other streams p50 {ms(p50)}, p99 {ms(p99)} ({p99 / p50:.1f}x)",
            f"{len(inside)} of the {len(tail)} gaps at or above p99 ({share:.0%}) fall inside a "
            f"long prompt's prefill",
            f"{len(long_lens)} long prompts (>= {int(cut)} tokens, median "
            f"{int(np.median(long_lens))}) of {len(prompts)}",
        ],
        fixes=fixes_for("pd-interference"),
        time_ranges=sorted(inside, key=lambda g: g[0] - g[1])[:3],
        values={"itl_p50_s": p50, "itl_p99_s": p99, "tail_share_in_prefill": share,
                "long_prompts": len(long_lens)},  # fmt: skip
    )


RULE = Rule(
    "pd-interference",
    "ITL p99 made of long prompts' prefill steps: disaggregate or chunk finer",
    check,
)
