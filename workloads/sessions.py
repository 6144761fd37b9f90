"""Sessions recovered from traces: Mooncake `hash_ids` chains.

A Mooncake request names its prompt's 512-token blocks by hash id. When a conversation goes on,
the next turn's prompt is the previous prompt, its reply and a new message, so it starts with
every FULL block of the previous prompt (the last, partial block changes: the reply fills it).
Request B continues request A when B's block ids start with all of A's full blocks (the
latest such A, the longest match) and B's prompt is longer. Two rules keep the chains honest:
- A must have at least MIN_FULL_BLOCKS full blocks: block 0 is shared by every request of the
  conversation trace (a system prompt), so a one-block match says nothing;
- a request is continued at most once; a second request extending the same one (a retry or a
  branch) starts a session of its own.
A continuation becomes turn k+1 of A's session with `prompt_len` = the new message (its input
minus A's input and output, at least 1) and `think_s` = the gap between the two arrivals (the
trace does not say when A's reply ended, so replayed sessions run longer by the reply times).
"""

from __future__ import annotations

import dataclasses

from cbbench.workloads.spec import RequestSpec, Workload

MIN_FULL_BLOCKS = 2


def chain_sessions(wl: Workload) -> Workload:
    """`wl` with session_id/turn/think_s filled from prefix-id chains; stats in its source."""
    bs = wl.prefix_block_size
    by_full: dict[tuple[int, ...], int] = {}  # full-block ids -> the latest request with them
    continued: set[int] = set()
    out: list[RequestSpec] = []
    short_messages = 0
    for i, r in enumerate(wl.requests):
        ids = tuple(r.prefix_ids)
        parent = None
        for n in range(len(ids), MIN_FULL_BLOCKS - 1, -1):  # the longest match first
            a = by_full.get(ids[:n])
            if a is not None:
                parent = (
                    a if a not in continued and wl.requests[a].prompt_len < r.prompt_len else None
                )
                break
        if parent is None:
            out.append(dataclasses.replace(r, session_id=f"m{r.index}", turn=1, think_s=None))
        else:
            continued.add(parent)
            p, q = wl.requests[parent], out[parent]
            new = r.prompt_len - p.prompt_len - p.output_len
            short_messages += new < 1
            think = None
            if r.arrival_s is not None and p.arrival_s is not None:
                think = max(0.0, r.arrival_s - p.arrival_s)
            out.append(
                dataclasses.replace(
                    r,
                    prompt_len=max(1, new),
                    session_id=q.session_id,
                    turn=(q.turn or 1) + 1,
                    think_s=think,
                )
            )
        full = ids[: r.prompt_len // bs]
        if len(full) >= MIN_FULL_BLOCKS:
            by_full[full] = i
    turns: dict[str, int] = {}
    for r in out:
        turns[r.session_id] = max(turns.get(r.session_id, 0), r.turn or 1)
    stats = {
        "sessions": len(turns),
        "multi_turn_sessions": sum(t > 1 for t in turns.values()),
        "continuations": sum((r.turn or 1) > 1 for r in out),
        "max_turns": max(turns.values(), default=0),
        "new_message_clamped": short_messages,  # input shorter than history + reply: set to 1
    }
    return dataclasses.replace(wl, requests=tuple(out), source=wl.source | {"sessions": stats})
