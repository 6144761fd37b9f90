"""OpenTelemetry GenAI traces -> agent-graph sessions (one session per trace id).

A trace's LLM spans (`otel_spans.llm_kind`) become the calls of a session; other spans (tool
runs, agent invocations) are skipped and counted by reason. The graph:
- causal edges: an `assistant` message of a call's input that equals the output of a call
  that started before it (its text, or its tool call ids) makes that call a predecessor (the
  latest such one that had ended, where several match), and the turn is replayed with what
  the server answered for it (`GraphCall.live`); a span link to another LLM span is a causal
  edge too (links can make a cycle: an error);
- temporal edges, the fallback for a call with no causal one: the calls that ended last
  before it started (those ending within TOGETHER_NS of the latest, all of them);
- a cycle is an error naming a span on it; then the transitive reduction keeps only direct
  predecessors;
- the recorded wait: the call's start minus its predecessors' latest end (tool or think
  time; 0 where the recording overlaps), a later root's: its start minus the session's.
`max_tokens`: the recorded output tokens (`gen_ai.usage.output_tokens`), else the recorded
output's words (text and tool-call arguments), else the request's `gen_ai.request.max_tokens`. Sessions carry no arrival times:
they start by `--concurrency` or the arrival process (`--rate`).

Errors end in one line naming the file, the span and the fault: a cycle, an LLM span
without input messages, bad timestamps (unreadable, or an end before the start).
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import re
from collections import Counter
from pathlib import Path

from cbbench.workloads.errors import WorkloadError
from cbbench.workloads.graph import GraphCall, depths, topo_order, transitive_reduction
from cbbench.workloads.otel_spans import (
    LLMCall,
    Span,
    llm_call,
    llm_kind,
    load_objects,
    read_spans,
)
from cbbench.workloads.spec import RequestSpec, Workload

TOGETHER_NS = 1_000_000  # predecessors ending within 1 ms of each other ended together
OTEL_KEY = re.compile(r'(?<!\\)"(resourceSpans|spans)"\s*:\s*\[')  # a key holding a list
SUFFIXES = (".json", ".jsonl")  # .jsonl: the collector's file exporter, an object a line


def is_otel_trace(path: Path) -> bool:
    """A .json/.jsonl file of objects holding a `resourceSpans` or `spans` list (a key: the
    name unescaped, a colon and a list, never text inside a string), or a folder of them."""
    if path.is_dir():
        return any(is_otel_trace(p) for p in _candidates(path))
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES or not path.is_file():
        return False
    with open(path, encoding="utf-8", errors="replace") as f:
        if suffix == ".json":
            head = f.read(1 << 16)
            return head.lstrip().startswith("{") and OTEL_KEY.search(head) is not None
        line = f.readline()  # .jsonl: the first object's own keys
        while line and not line.strip():
            line = f.readline()
    try:
        first = json.loads(line)
    except json.JSONDecodeError:
        return False
    return isinstance(first, dict) and any(
        isinstance(first.get(k), list) for k in ("resourceSpans", "spans")
    )


def _words(text: str) -> int:
    return max(1, len(text.split()))


def _output_keys(msg: dict) -> tuple[str, frozenset]:
    """What identifies an answer in a later call's input: its text, its tool call ids."""
    text = (msg.get("content") or "").strip()
    return text, frozenset(c.get("id") for c in msg.get("tool_calls") or [] if c.get("id"))


def _session_graph(
    spans: list[Span], calls: dict[str, LLMCall], where: str
) -> tuple[list[str], dict[str, set[str]], dict[str, list[tuple[int, str]]]]:
    """(calls in dispatch order, direct predecessors, live splices) of one session."""
    by_id = {s.id: s for s in spans}
    ids = sorted(calls, key=lambda i: (by_id[i].start_ns, by_id[i].end_ns, i))
    after: dict[str, set[str]] = {i: set() for i in ids}
    live: dict[str, list[tuple[int, str]]] = {i: [] for i in ids}
    by_text: dict[str, list[str]] = {}  # an answer's text / tool call ids -> the calls
    by_calls: dict[frozenset, list[str]] = {}
    for j in ids:
        text, call_ids = _output_keys(calls[j].output)
        if text:
            by_text.setdefault(text, []).append(j)
        if call_ids:
            by_calls.setdefault(call_ids, []).append(j)
    for i in ids:
        s = by_id[i]
        for pos, msg in enumerate(calls[i].messages):
            if msg.get("role") != "assistant":
                continue
            text, call_ids = _output_keys(msg)
            found = set(by_text.get(text, ()) if text else ()) | set(by_calls.get(call_ids, ()))
            # a call started after this one cannot have written its input (the same short
            # "OK" later on); of the rest, the latest that ended before this one started
            producers = sorted(j for j in found - {i} if by_id[j].start_ns < s.start_ns)
            if not producers:
                continue
            done = [j for j in producers if by_id[j].end_ns <= s.start_ns]
            j = max(done or producers, key=lambda j: (by_id[j].end_ns, j))
            after[i].add(j)
            live[i].append((pos, j))
        after[i] |= {lk for lk in s.links if lk in calls and lk != i}
    for i in ids:
        if after[i]:
            continue
        s = by_id[i]
        ended = [j for j in ids if j != i and by_id[j].end_ns <= s.start_ns]
        if ended:
            last = max(by_id[j].end_ns for j in ended)
            after[i] = {j for j in ended if last - by_id[j].end_ns <= TOGETHER_NS}
    topo_order({i: sorted(after[i]) for i in ids}, where)  # a cycle ends here, by name
    order = _stable_topo(ids, after, {i: k for k, i in enumerate(ids)})
    return order, transitive_reduction(after, order), live


def _stable_topo(ids: list[str], after: dict[str, set[str]], rank: dict[str, int]) -> list[str]:
    """A topological order that keeps the recorded start order where the edges allow."""
    waiting = {i: len(after[i]) for i in ids}
    succ: dict[str, list[str]] = {i: [] for i in ids}
    for i in ids:
        for p in after[i]:
            succ[p].append(i)
    heap = [(rank[i], i) for i in ids if waiting[i] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, i = heapq.heappop(heap)
        out.append(i)
        for n in succ[i]:
            waiting[n] -= 1
            if waiting[n] == 0:
                heapq.heappush(heap, (rank[n], n))
    assert len(out) == len(ids), "topo_order found no cycle"
    return out


def _candidates(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in SUFFIXES and p.is_file())


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        files = [p for p in _candidates(path) if is_otel_trace(p)]
        if not files:
            raise WorkloadError(f"{path}: no OpenTelemetry trace files (.json, .jsonl) here")
        return files
    return [path]


def read_otel(
    path: str | Path, name: str, seed: int = 0, num_requests: int | None = None
) -> Workload:
    path = Path(path)
    skipped: Counter = Counter()
    requests: list[RequestSpec] = []
    n_sessions = n_spans = n_live = 0
    seen_sessions: set[str] = set()
    for f in _files(path):
        where = str(f)
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise WorkloadError(f"{where}: not a readable JSON trace: {exc}") from None
        spans = [sp for obj in load_objects(text, where) for sp in read_spans(obj, where)]
        n_spans += len(spans)
        traces: dict[str, list[Span]] = {}
        for s in spans:
            traces.setdefault(s.trace, []).append(s)
        for trace_id, group in traces.items():
            calls: dict[str, LLMCall] = {}
            for s in group:
                kind = llm_kind(s)
                if kind is None:
                    op = s.attrs.get("gen_ai.operation.name") or s.name or "unnamed"
                    skipped[f"not an LLM call ({op})"] += 1
                    continue
                call = llm_call(s, kind)
                if call is None:
                    raise WorkloadError(
                        f"{where}: span {s.id}: an LLM call without input messages "
                        "(gen_ai.input.messages): nothing to replay (record message content: "
                        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true)"
                    )
                if s.id in calls:
                    raise WorkloadError(f"{where}: span {s.id}: the span id appears twice")
                calls[s.id] = call
            if not calls:
                continue
            sid = trace_id or f.stem
            if sid in seen_sessions:
                sid = f"{sid}@{f.stem}"
            seen_sessions.add(sid)
            session = _session_requests(group, calls, sid, len(requests), where)
            requests.extend(session)
            n_live += sum(len(r.graph.live) for r in session)
            n_sessions += 1
            if num_requests is not None and len(requests) >= num_requests:
                break
        if num_requests is not None and len(requests) >= num_requests:
            break
    if not requests:
        reasons = ", ".join(f"{k} {v}" for k, v in skipped.items()) or "no spans"
        raise WorkloadError(f"{path}: no LLM spans to replay ({reasons})")
    if num_requests is not None and len(requests) > num_requests:
        requests = _cut(requests, num_requests)
    return Workload(
        name=name,
        seed=seed,
        requests=tuple(requests),
        source={
            "format": "otel",
            "path": str(path),
            "sessions": n_sessions,
            "spans": n_spans,
            "live_turns": n_live,
            "rows_skipped": dict(sorted(skipped.items())),
        },
    )


def _session_requests(
    group: list[Span], calls: dict[str, LLMCall], sid: str, base: int, where: str
) -> list[RequestSpec]:
    order, after, live = _session_graph(group, calls, where)
    by_id = {s.id: s for s in group}
    index = {i: base + k for k, i in enumerate(order)}
    depth = depths(after, order)
    t0 = min(by_id[i].start_ns for i in order)
    out = []
    for k, i in enumerate(order):
        s, c = by_id[i], calls[i]
        preds = sorted(after[i], key=lambda p: index[p])
        if preds:
            wait = max(0, s.start_ns - max(by_id[p].end_ns for p in preds)) / 1e9
        else:
            wait = (s.start_ns - t0) / 1e9 if k else None
        messages_text = " ".join(m.get("content") or "" for m in c.messages)
        out_text = (c.output.get("content") or "") + " ".join(
            (t.get("function") or {}).get("arguments") or ""
            for t in c.output.get("tool_calls") or ()
        )
        recorded = _words(out_text) if out_text.strip() else None
        output_len = c.output_tokens or recorded or c.max_tokens or 1
        out.append(
            RequestSpec(
                index=index[i],
                prompt_len=c.input_tokens or _words(messages_text),
                output_len=max(1, output_len),
                session_id=sid,
                turn=k + 1,
                think_s=wait,
                graph=GraphCall(
                    after=tuple(index[p] for p in preds),
                    messages=json.dumps(c.messages),
                    live=tuple((pos, index[j]) for pos, j in live[i]),
                    tools=json.dumps(c.tools) if c.tools else "",
                    name=i,
                    depth=depth[i],
                    calls=len(order),
                ),
            )
        )
    return out


def _cut(requests: list[RequestSpec], n: int) -> list[RequestSpec]:
    """The first n calls; a session cut short counts the calls it kept."""
    kept = requests[:n]
    counts = Counter(r.session_id for r in kept)
    return [
        dataclasses.replace(r, graph=dataclasses.replace(r.graph, calls=counts[r.session_id]))
        for r in kept
    ]
