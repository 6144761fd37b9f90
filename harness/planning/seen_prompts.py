"""How many prompt tokens of each request a server served from its prefix cache, for the
from-run fit (reference_engine/sim/run_fit.py): the step model prices the tokens a server
computes, and a prompt it had seen before costs only its tail.

Where the server says it (`usage.prompt_tokens_details.cached_tokens`: vLLM with
`--enable-prompt-tokens-details`, SGLang, the reference engine), its count is used.
Otherwise a prompt is known by what generated it: bench's prompts are a pure function of
the workload (its file name and seed) and the request's index and length
(workloads/tokens.py), so a request whose prompt an earlier run sent, or an earlier request
of its own run that had finished, finds every full KV block of it cached (vLLM's rule: the
last token is always computed). Runs are taken in the order they started; warm-ups that
were not fitted are given as `--served-before`. Evictions are not modelled: a cache smaller
than the prompts sent since takes fewer hits than this counts.
"""

from __future__ import annotations

from pathlib import PurePath


def prompt_key(meta: dict, record) -> tuple | None:
    """What identifies the prompt a bench record sent (None: not known, e.g. a later turn
    of a conversation, whose prompt carries the replies, or another tool's run: its prompts
    are not bench's, whatever workload name `cbbench import --workload` gave it)."""
    wl = meta.get("workload") or {}
    if meta.get("imported") or not wl.get("name") or record.turn not in (None, 1) or record.history_len:
        return None
    return (PurePath(str(wl["name"])).name, wl.get("seed"), record.index, record.prompt_len)


def cached_tokens(loaded: list, settings: dict) -> list[dict[str, int]]:
    """Per run of `loaded` (harness.results.run_folder runs), record id -> prompt tokens the
    server had cached when it arrived: the server's own count where a record carries it,
    else its prompt seen before (module doc). Empty where the server's prefix caching is off."""
    out: list[dict[str, int]] = [{} for _ in loaded]
    if settings.get("enable_prefix_caching") is False:
        return out
    bs = int(settings.get("block_size") or 16)
    seen: set[tuple] = set()
    order = sorted(range(len(loaded)), key=lambda i: str(loaded[i].meta.get("started_at") or ""))
    for i in order:
        run = loaded[i]
        recs = sorted((r for r in run.records if r.sent_s is not None), key=lambda r: r.sent_s)
        done: list[tuple[float, tuple]] = []  # this run's: (end, key)
        for r in recs:
            said = r.extra.get("num_cached_tokens")
            key = prompt_key(run.meta, r)
            known = seen | {k for end, k in done if end <= r.sent_s}
            if isinstance(said, (int, float)) and not isinstance(said, bool):
                out[i][r.id] = int(said)
            elif key is not None and key in known:
                out[i][r.id] = (max(r.prompt_len, 1) - 1) // bs * bs
            if key is not None and r.ok and r.e2e_s is not None:
                done.append((r.sent_s + r.e2e_s, key))
        seen |= {k for _, k in done}
    return out
