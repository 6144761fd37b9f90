"""Agent graphs: a session as a DAG of calls (a chain is the special case).

A call (a `RequestSpec` with a `GraphCall`) names the calls it waits for (`after`: request
indices of the same session), the wait after the last of them ended (`RequestSpec.think_s`:
tool or think time), its chat messages as recorded, which of their assistant turns are a
predecessor's output (`live`: replaced at run time by what the server actually answered for
that call), the tools it offers and its `max_tokens` (`output_len`). Requests of a session
without a `GraphCall` are a chain: turn k waits for turn k-1 (today's multi-turn and agent
sessions, whose history the load generator builds).

Trace formats (OpenTelemetry GenAI spans: `trace_otel.py`) and the `agent-graph` preset
(`agent_graph.py`) build this one shape; `harness/load/` dispatches a call when its
predecessors are done and its wait has passed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cbbench.workloads.errors import WorkloadError


@dataclass(frozen=True)
class GraphCall:
    """What makes a session request a node of a call graph."""

    after: tuple[int, ...]  # request indices this call waits for (its direct predecessors)
    messages: str  # the chat messages as JSON text (OpenAI chat shape), as recorded
    live: tuple[tuple[int, int], ...] = ()  # (message position, request index): that
    # assistant turn is the request's output, replaced by the server's live answer
    tools: str = ""  # the `tools` list offered (OpenAI chat shape) as JSON text
    name: str = ""  # the span id / node name it came from (errors, `workload show`)
    depth: int = 0  # longest path from a root of its session (its "step")
    calls: int = 1  # calls in its session (a session succeeded when all were answered)


def parse_graph_call(obj: object, where: str) -> GraphCall | None:
    """A native JSONL line's `graph` field -> GraphCall (None stays None)."""
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: graph must be an object, got {obj!r}")
    try:
        call = GraphCall(
            after=tuple(int(p) for p in obj.get("after") or ()),
            messages=str(obj["messages"]),
            live=tuple((int(a), int(b)) for a, b in obj.get("live") or ()),
            tools=str(obj.get("tools") or ""),
            name=str(obj.get("name") or ""),
            depth=int(obj.get("depth") or 0),
            calls=int(obj.get("calls") or 1),
        )
        messages = json.loads(call.messages)
    except (KeyError, TypeError, ValueError) as exc:
        raise WorkloadError(f"{where}: graph: {exc!r}") from None
    if not isinstance(messages, list) or any(not 0 <= a < len(messages) for a, _ in call.live):
        raise WorkloadError(f"{where}: graph: 'live' names a message the call does not have")
    return call


def topo_order(after: dict[str, Sequence[str]], where: str) -> list[str]:
    """Nodes in an order where every node follows its predecessors; a cycle is an error
    naming a node on it and the cycle (`where`: the file)."""
    state: dict[str, int] = {}  # 1 visiting, 2 done
    order: list[str] = []
    for start in after:
        if state.get(start):
            continue
        stack: list[tuple[str, int]] = [(start, 0)]
        path: list[str] = []
        while stack:
            node, i = stack.pop()
            if i == 0:
                state[node] = 1
                path.append(node)
            preds = list(after.get(node, ()))
            if i < len(preds):
                stack.append((node, i + 1))
                p = preds[i]
                if state.get(p) == 1:
                    cycle = path[path.index(p) :] + [p]
                    raise WorkloadError(
                        f"{where}: span {p}: a cycle in the call graph "
                        f"({' -> '.join(reversed(cycle))})"
                    )
                if not state.get(p):
                    stack.append((p, 0))
                continue
            state[node] = 2
            path.pop()
            order.append(node)
    return order


def transitive_reduction(after: dict[str, set[str]], order: Sequence[str]) -> dict[str, set[str]]:
    """Only direct predecessors: an edge p -> n goes when n reaches p through another
    predecessor. `order`: a topological order of `after`'s nodes (ancestors as bit sets)."""
    pos = {n: k for k, n in enumerate(order)}
    ancestors: dict[str, int] = {}
    out = {}
    for n in order:
        preds = after.get(n, set())
        indirect = 0
        for p in preds:
            indirect |= ancestors[p]
        out[n] = {p for p in preds if not (indirect >> pos[p]) & 1}
        ancestors[n] = indirect
        for p in preds:
            ancestors[n] |= 1 << pos[p]
    return out


def depths(after: dict[str, Iterable[str]], order: Sequence[str]) -> dict[str, int]:
    d: dict[str, int] = {}
    for n in order:
        d[n] = max((d[p] + 1 for p in after.get(n, ())), default=0)
    return d


def fan_out_width(after: dict[int, Iterable[int]]) -> int:
    """The most calls that wait on one call (1 for a chain, K for a K-way fan-out)."""
    succ: dict[int, int] = {}
    for preds in after.values():
        for p in preds:
            succ[p] = succ.get(p, 0) + 1
    return max(succ.values(), default=1 if after else 0)


def graph_stats(requests: Sequence) -> dict | None:
    """A graph workload's shape (`workload show --json`): sessions, calls, depth, fan-out."""
    sessions: dict[str, list] = {}
    for r in requests:
        if r.graph is not None:
            sessions.setdefault(r.session_id or "", []).append(r)
    if not sessions:
        return None
    widths = [fan_out_width({r.index: r.graph.after for r in c}) for c in sessions.values()]
    return {
        "sessions": len(sessions),
        "calls": sum(len(c) for c in sessions.values()),
        "depth_max": max(r.graph.depth for c in sessions.values() for r in c) + 1,
        "fan_out_max": max(widths),
        "live_turns": sum(len(r.graph.live) for c in sessions.values() for r in c),
    }


def graph_lines(requests: Sequence, limit: int = 8) -> list[str]:
    """`cbbench workload show`: each graph session's calls, predecessors, waits and sizes."""
    sessions: dict[str, list] = {}
    for r in requests:
        if r.graph is not None:
            sessions.setdefault(r.session_id or "", []).append(r)
    if not sessions:
        return []
    out = [f"call graph: {len(sessions)} sessions"]
    for sid, calls in list(sessions.items())[:limit]:
        after = {r.index: r.graph.after for r in calls}
        width = fan_out_width(after)
        out.append(
            f"session {sid}: {len(calls)} calls, depth {max(r.graph.depth for r in calls) + 1}, "
            f"fan-out {width}"
        )
        names = {r.index: r.graph.name or f"#{r.index}" for r in calls}
        for r in calls:
            g = r.graph
            preds = ", ".join(names.get(p, f"#{p}") for p in g.after) or "(root)"
            live = f", {len(g.live)} live" if g.live else ""
            n_msgs = len(json.loads(g.messages)) if g.messages else 0
            wait = f"{r.think_s:.3f} s" if r.think_s is not None else "-"
            out.append(
                f"  {names[r.index]:<20} after {preds}; wait {wait}; {n_msgs} messages{live}; "
                f"prompt {r.prompt_len}, max_tokens {r.output_len}"
            )
    if len(sessions) > limit:
        out.append(f"... {len(sessions) - limit} more sessions")
    return out


def check_graph(requests: Sequence, where: str) -> None:
    """Every predecessor is an earlier request of the same session (the load generator
    dispatches in request order within a session)."""
    by_index = {r.index: r for r in requests}
    for r in requests:
        if r.graph is None:
            continue
        for p in r.graph.after:
            q = by_index.get(p)
            if q is None or q.session_id != r.session_id or p >= r.index:
                raise WorkloadError(
                    f"{where}: call {r.graph.name or r.index}: predecessor {p} is not an earlier "
                    f"call of session {r.session_id!r}"
                )
