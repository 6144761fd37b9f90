"""Agent traces: a JSONL session format, one step a line, and the conversion of a chained
Mooncake-format trace (the tool&agent trace has the conversation trace's fields) to agent
sessions.

```
{"cbbench_agent_trace": 1}                                  (optional header)
{"session_id": "s1", "step": 1, "timestamp_s": 0.0, "input_tokens": 5200,
 "output_tokens": 48, "system_tokens": 4096, "tools": 8, "block_ids": [0, 1, 2, ...]}
{"session_id": "s1", "step": 2, "timestamp_s": 3.9, "input_tokens": 5900,
 "output_tokens": 35, "tool_latency_s": 2.1}
```
`input_tokens` is the step's whole prompt as the trace saw it (history included), `step`
counts from 1 within a session and increases line by line, `tool_latency_s` is the wait
before the step (the tool's run; else the gap between the two timestamps), `block_ids` the
prompt's KV block ids where known (512 tokens each, Mooncake's), `system_tokens` and `tools`
(count) describe step 1's shared part. Step k's new message (the tool result) is its input
minus step k-1's input and output; the last step of a session is its final answer.
Errors name the line: steps out of order, a context that shrinks, a missing field.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
from cbbench.workloads.agent import DEFAULTS, _tools
from cbbench.workloads.distributions import parse_dist
from cbbench.workloads.errors import WorkloadError
from cbbench.workloads.spec import AgentStep, RequestSpec, ToolCall, Workload
from cbbench.workloads.trace_mooncake import json_lines, parse_ids

HEADER_KEY = "cbbench_agent_trace"
STEP_KEYS = (
    "session_id", "step", "timestamp_s", "input_tokens", "output_tokens", "tool_latency_s",
    "system_tokens", "tools", "block_ids",
)  # fmt: skip
BLOCK_SIZE = 512
TOOLS_STREAM = 60


def is_agent_trace_object(obj: object) -> bool:
    return isinstance(obj, dict) and (HEADER_KEY in obj or {"step", "input_tokens"} <= set(obj))


def parse_agent_step(obj: object, turn: int | None, where: str) -> AgentStep | None:
    """A native JSONL line's `agent` field -> AgentStep (None stays None)."""
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: agent must be an object, got {obj!r}")
    call = obj.get("call")
    try:
        step = AgentStep(
            tools=str(obj.get("tools") or ""),
            system_len=int(obj.get("system_len") or 0),
            call=None if call is None else ToolCall(**call),
            answers=obj.get("answers"),
        )
    except (TypeError, ValueError) as exc:
        raise WorkloadError(f"{where}: agent: {exc}") from None
    if (turn or 1) > 1 and not step.answers:
        raise WorkloadError(f"{where}: agent step {turn} is a tool result without its call id")
    return step


def _num(obj: dict, key: str, where: str, minimum: float, required: bool = True) -> float | None:
    v = obj.get(key)
    if v is None and not required:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise WorkloadError(f"{where}: '{key}' must be a number, got {v!r}")
    if v < minimum:
        raise WorkloadError(f"{where}: '{key}' must be >= {minimum:g}, got {v!r}")
    return float(v)


def _tool_set(seed: int, count: int) -> str:
    if count <= 0:
        return ""
    rng = np.random.default_rng([seed, TOOLS_STREAM, count])
    return json.dumps(_tools(rng, count, parse_dist(DEFAULTS["tool_tokens"], "tool_tokens")))


def read_agent_trace(
    path: str | Path, name: str, seed: int = 0, num_requests: int | None = None
) -> Workload:
    steps: dict[str, list[tuple[str, dict]]] = {}
    order: list[str] = []
    for where, obj in json_lines(path):
        if not isinstance(obj, dict):
            raise WorkloadError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        if HEADER_KEY in obj:
            if order:
                raise WorkloadError(f"{where}: the '{HEADER_KEY}' header must be the first line")
            continue
        for key in obj:
            if key not in STEP_KEYS:
                raise WorkloadError(f"{where}: unknown key '{key}' (keys: {', '.join(STEP_KEYS)})")
        sid = obj.get("session_id")
        if not isinstance(sid, str) or not sid:
            raise WorkloadError(f"{where}: 'session_id' must be a non-empty string, got {sid!r}")
        step = obj.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise WorkloadError(f"{where}: 'step' must be an integer >= 1, got {step!r}")
        prev = steps.get(sid)
        if prev is None:
            if step != 1:
                raise WorkloadError(f"{where}: session {sid!r} starts at step {step}, not 1")
            steps[sid] = prev = []
            order.append(sid)
        elif step != prev[-1][1]["step"] + 1:
            raise WorkloadError(
                f"{where}: session {sid!r}: step {step} after step {prev[-1][1]['step']} "
                "(steps out of order)"
            )
        prev.append((where, obj))
    requests: list[RequestSpec] = []
    for s, sid in enumerate(order):
        session = steps[sid]
        last_in = last_out = last_t = None
        tools = ""
        for k, (where, obj) in enumerate(session, start=1):
            n_in = int(_num(obj, "input_tokens", where, 1))  # type: ignore[arg-type]
            n_out = int(_num(obj, "output_tokens", where, 1))  # type: ignore[arg-type]
            t = _num(obj, "timestamp_s", where, 0, required=False)
            if t is not None and last_t is not None and t < last_t:
                raise WorkloadError(
                    f"{where}: session {sid!r}: timestamp {t:g} s before step {k - 1}'s"
                )
            ids = parse_ids(obj.get("block_ids", []), "block_ids", where)
            if k == 1:
                system = int(_num(obj, "system_tokens", where, 0, required=False) or 0)
                if system >= n_in:
                    raise WorkloadError(f"{where}: system_tokens {system} >= input_tokens {n_in}")
                count = int(_num(obj, "tools", where, 0, required=False) or 0)
                tools = _tool_set(seed, count)
                new = n_in - system
                prefix = tuple(ids[: system // BLOCK_SIZE])
                think = None
            else:
                new = n_in - last_in - last_out  # type: ignore[operator]
                if new < 1:
                    raise WorkloadError(
                        f"{where}: session {sid!r}: input_tokens {n_in} leaves no room for a tool "
                        f"result after step {k - 1}'s {last_in} + {last_out} (the context shrank)"
                    )
                prefix = ()
                think = _num(obj, "tool_latency_s", where, 0, required=False)
                if think is None and t is not None and last_t is not None:
                    think = t - last_t
            final = k == len(session)
            call = (
                None if final else ToolCall(f"call_{s}_{k}", "tool_0", json.dumps({"query": "x"}))
            )
            requests.append(
                RequestSpec(
                    index=len(requests),
                    prompt_len=new,
                    output_len=n_out,
                    arrival_s=t if k == 1 else None,
                    prefix_ids=prefix,
                    session_id=sid,
                    turn=k,
                    think_s=think,
                    agent=AgentStep(
                        tools,
                        system if k == 1 else 0,
                        call,
                        None if k == 1 else f"call_{s}_{k - 1}",
                    ),
                )
            )
            last_in, last_out, last_t = n_in, n_out, t if t is not None else last_t
        if num_requests is not None and len(requests) >= num_requests:
            break
    requests = requests[:num_requests] if num_requests is not None else requests
    if any(r.arrival_s is None for r in requests if r.turn == 1):  # all or none timed
        requests = [dataclasses.replace(r, arrival_s=None) for r in requests]
    _fix_system_len(requests)
    return Workload(
        name=name,
        seed=seed,
        requests=tuple(requests),
        prefix_block_size=BLOCK_SIZE,
        source={"format": "agent", "path": str(path), "sessions": len(order)},
    )


def _fix_system_len(requests: list[RequestSpec]) -> None:
    """Later steps carry their session's system length too (the client reads step 1's)."""
    system = 0
    for i, r in enumerate(requests):
        if r.turn == 1:
            system = r.agent.system_len  # type: ignore[union-attr]
        elif r.agent is not None and r.agent.system_len != system:
            requests[i] = dataclasses.replace(
                r, agent=dataclasses.replace(r.agent, system_len=system)
            )


def as_agent_sessions(wl: Workload) -> Workload:
    """Chained sessions (Mooncake `sessions`) as agent steps: each turn after the first is a
    tool result answering the previous turn's call, the last turn the final answer."""
    last_turn: dict[str, int] = {}
    for r in wl.requests:
        last_turn[r.session_id or ""] = max(last_turn.get(r.session_id or "", 0), r.turn or 1)
    out = []
    for r in wl.requests:
        sid, k = r.session_id or "", r.turn or 1
        call = None
        if k < last_turn[sid]:
            call = ToolCall(f"call_{sid}_{k}", "tool_0", json.dumps({"query": "x"}))
        answers = f"call_{sid}_{k - 1}" if k > 1 else None
        out.append(dataclasses.replace(r, agent=AgentStep("", 0, call, answers)))
    return dataclasses.replace(wl, requests=tuple(out), source=wl.source | {"agent": True})
