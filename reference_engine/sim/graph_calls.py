"""Agent-graph sessions in the offline replay: when a call is due and which ids it sends.

The load layer's rule (harness/load/graph.py), in virtual time: a call is due when every
predecessor (`GraphCall.after`) has finished, plus its recorded wait (`think_s`); a session's
roots are due at its arrival (a root after the first also waits its `think_s`, as the load
generator's does). Calls whose predecessors finish together are due together and share the
batch. The replay has no text, so a live turn (an assistant or tool message that is a
predecessor's output) is that predecessor's simulated output ids: the spliced turn is as long
as the simulated answer, not the recorded one. The other messages are ids drawn from the
message's content (the same content, the same ids: siblings that share their history share a
prefix the cache can hit); their lengths are word counts scaled so the recorded messages
add up to the call's `prompt_len`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence

from cbbench.workloads.spec import RequestSpec

PromptIds = Callable[[int, int, tuple[int, ...]], list[int]]  # (index, length, prefix ids)
CONTENT_KEYS = 1 << 40  # ids keyed by content hash live above every request index


def _words(content: object) -> int:
    if isinstance(content, str):
        return len(content.split())
    if isinstance(content, list):  # content parts
        return sum(_words(p.get("text") if isinstance(p, dict) else p) for p in content)
    return 0


def _live_split(r: RequestSpec) -> tuple[list, dict[int, int], list[int], int]:
    """The call's messages, its live turns, each message's words, and how many tokens its
    recorded (not live) messages hold."""
    assert r.graph is not None
    messages = json.loads(r.graph.messages) if r.graph.messages else []
    live = dict(r.graph.live)
    words = [_words(m.get("content")) if isinstance(m, dict) else 0 for m in messages]
    recorded_live = sum(words[pos] for pos in live if pos < len(words))
    return messages, live, words, max(0, r.prompt_len - recorded_live)


def spliced_prompt_len(r: RequestSpec, by_index: dict[int, RequestSpec]) -> int:
    """The prompt a call will have in the replay, before it runs: its recorded messages
    plus each spliced answer at its source's `max_tokens` (the simulator ignores EOS)."""
    if r.graph is None or not r.graph.live:
        return r.prompt_len
    _, live, _, target = _live_split(r)
    return max(1, target + sum(by_index[s].output_len for s in live.values() if s in by_index))


class GraphSessions:
    """The graph sessions of a replay: `roots()` to queue first, `on_finished` releases
    the calls whose predecessors are all done (as (due time, spec) pairs)."""

    def __init__(self, calls: Sequence[RequestSpec], prompt_ids: PromptIds) -> None:
        self.prompt_ids = prompt_ids
        self.spec = {r.index: r for r in calls}
        self.left: dict[int, int] = {}  # call -> predecessors not finished yet
        self.succ: dict[int, list[int]] = {}
        self.done_at: dict[int, float] = {}
        self.out: dict[int, list[int]] = {}
        self.start: dict[str, float] = {}
        self.first: dict[str, int] = {}
        self.after: dict[int, tuple[int, ...]] = {}  # a request without a GraphCall: the
        prev: dict[str, int] = {}  # session's previous one (harness/load/graph.predecessors)
        for r in sorted(calls, key=lambda r: r.index):
            sid = r.session_id or ""
            if sid not in self.first:
                self.first[sid] = r.index
                self.start[sid] = r.arrival_s or 0.0
            if r.graph is not None:
                after = r.graph.after
            else:
                after = (prev[sid],) if sid in prev else ()
            prev[sid] = r.index
            self.after[r.index] = after
            self.left[r.index] = len(after)
            for p in after:
                assert p in self.spec, f"call {r.index}: predecessor {p} is not in the replay"
                self.succ.setdefault(p, []).append(r.index)
        self.unreleased = len(self.spec)

    def roots(self) -> list[tuple[float, RequestSpec]]:
        out = []
        for i, n in self.left.items():
            if n == 0:
                r = self.spec[i]
                sid = r.session_id or ""
                wait = 0.0 if i == self.first[sid] else (r.think_s or 0.0)
                out.append((self.start[sid] + wait, r))
        self.unreleased -= len(out)
        return out

    def on_finished(
        self, index: int, finished_s: float, output_ids: list[int]
    ) -> list[tuple[float, RequestSpec]]:
        self.done_at[index] = finished_s
        self.out[index] = list(output_ids)
        due = []
        for s in self.succ.get(index, ()):
            self.left[s] -= 1
            if self.left[s] == 0:
                r = self.spec[s]
                ready = max(self.done_at[p] for p in self.after[s])
                due.append((ready + (r.think_s or 0.0), r))
        self.unreleased -= len(due)
        return due

    def prompt(self, r: RequestSpec) -> list[int]:
        """The call's prompt ids: its messages in order, live turns as their source's
        simulated output ids (see the module docstring)."""
        if r.graph is None:
            return self.prompt_ids(r.index, r.prompt_len, r.prefix_ids)
        messages, live, words, target = _live_split(r)
        plain = sum(w for pos, w in enumerate(words) if pos not in live)
        ids: list[int] = []
        for pos, m in enumerate(messages):
            if pos in live:
                src = live[pos]
                assert src in self.out, f"call {r.index} due before call {src} finished"
                ids += self.out[src]
                continue
            if plain == 0:
                continue
            ids += self._content_ids(m, round(words[pos] * target / plain))
        if plain == 0 and target:
            ids += self.prompt_ids(r.index, target, ())
        elif not ids:
            ids = self.prompt_ids(r.index, max(1, target), ())
        return ids

    def _content_ids(self, message: object, n: int) -> list[int]:
        if n <= 0:
            return []
        text = json.dumps(message, sort_keys=True).encode()
        key = CONTENT_KEYS + int.from_bytes(hashlib.blake2b(text, digest_size=5).digest(), "big")
        return self.prompt_ids(key, n, ())
