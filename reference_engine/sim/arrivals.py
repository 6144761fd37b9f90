"""The offline replay's arrival queue, sessions included.

Single requests and sessions' first turns arrive at their `arrival_s` (None = 0). A session's
turn k+1 arrives `think_s` after turn k finished, and its prompt is turn k's prompt, turn k's
output ids and the new message's ids: the same conversation the load generator sends over
HTTP (prefix ids shape a first turn only). Turns are fed one at a time, so a session never
has two turns in the engine. Agent-graph sessions (requests with a `GraphCall`) are replayed
as graphs instead (graph_calls.py): a call is due when its predecessors have finished plus its
wait, and calls whose predecessors finished together are in the engine together.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from cbbench.reference_engine.sim.graph_calls import GraphSessions
from cbbench.workloads.spec import RequestSpec

PromptIds = Callable[[int, int, tuple[int, ...]], list[int]]  # (index, length, prefix ids)


class Arrivals:
    def __init__(self, requests: Sequence[RequestSpec], prompt_ids: PromptIds) -> None:
        self.prompt_ids = prompt_ids
        self._heap: list[tuple[float, int, RequestSpec, list[int] | None]] = []
        self._later: dict[str, list[RequestSpec]] = {}  # a session's turns still to come
        self._session_of: dict[str, RequestSpec] = {}  # request id -> its spec (sessions)
        firsts: dict[str, RequestSpec] = {}
        graph_sids = {r.session_id or "" for r in requests if r.graph is not None}
        self._graph = GraphSessions(
            [r for r in requests if r.graph is not None or (r.session_id or "") in graph_sids],
            prompt_ids,
        )
        for t, r in self._graph.roots():
            self._push(t, r, None)
        for r in sorted(requests, key=lambda r: (r.turn or 1, r.index)):
            if r.index in self._graph.spec:
                continue
            if r.session_id is None:
                self._push(r.arrival_s or 0.0, r, None)
            elif r.session_id not in firsts:
                firsts[r.session_id] = r
                self._push(r.arrival_s or 0.0, r, None)
            else:
                self._later.setdefault(r.session_id, []).append(r)
        self._prompts: dict[str, list[int]] = {}

    def _push(self, t: float, spec: RequestSpec, prompt: list[int] | None) -> None:
        heapq.heappush(self._heap, (t, spec.index, spec, prompt))

    @property
    def pending(self) -> bool:
        """Requests still to add: queued, or later turns waiting for a reply."""
        return bool(self._heap) or any(self._later.values()) or self._graph.unreleased > 0

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[tuple[RequestSpec, float, list[int]]]:
        """(spec, arrival time, prompt ids) of every request due by `now`, in time order."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            t, _, spec, prompt = heapq.heappop(self._heap)
            if spec.index in self._graph.spec:
                prompt = self._graph.prompt(spec)
                self._session_of[f"req-{spec.index}"] = spec
            elif prompt is None:
                prompt = self.prompt_ids(spec.index, spec.prompt_len, spec.prefix_ids)
            if spec.session_id is not None and spec.index not in self._graph.spec:
                self._prompts[f"req-{spec.index}"] = prompt
                self._session_of[f"req-{spec.index}"] = spec
            out.append((spec, t, prompt))
        return out

    def on_finished(self, request_id: str, finished_s: float, output_ids: list[int]) -> None:
        """A request ended: queue its session's next turn, if any."""
        spec = self._session_of.pop(request_id, None)
        if spec is None:
            return
        if spec.index in self._graph.spec:
            for t, nxt in self._graph.on_finished(spec.index, finished_s, output_ids):
                self._push(t, nxt, None)
            return
        prompt = self._prompts.pop(request_id)
        rest = self._later.get(spec.session_id or "")
        if not rest:
            return
        nxt = rest.pop(0)
        message = self.prompt_ids(nxt.index, nxt.prompt_len, ())
        self._push(finished_s + (nxt.think_s or 0.0), nxt, prompt + list(output_ids) + message)
