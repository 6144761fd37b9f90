"""Synthetic agent graphs (spec key `agent_graph`, preset `agent-graph`): an orchestrator fans
out to K sub-agents that run in parallel, each a chain of tool-calling steps, and a reducer
waits for all of them.

Per session:
- the orchestrator: its system prompt and the task; its reply is a plan that delegates one
  sub-task to each sub-agent (`tool_calls`, `plan` tokens);
- sub-agent k (K from `fan_out`), `depth` steps (drawn per sub-agent): step 1 sees the task,
  the orchestrator's plan (its LIVE answer) and its sub-task; each later step follows the
  previous one (its live answer, a tool call) and the tool's result (`result` tokens), after
  the tool's wait (`tool_ms`); step outputs `step` tokens;
- the reducer: the orchestrator's history, and one `tool` message per sub-agent carrying that
  sub-agent's live final answer; it answers (`answer` tokens) once every sub-agent has.
Text is words (one a token for most tokenizers). Defaults (our choices, stated so a user can
replace them): K uniform 2-6, depth uniform 1-3, system prompt 256 tokens shared by every
session, task lognormal median 100, plan median 60, steps median 40, results median 200,
answers median 150, tool waits lognormal median 500 ms (10 ms-30 s). `num_requests` counts
calls; the last session is cut at n (its calls counted as cut).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
from cbbench.workloads.agent import _tools, _words
from cbbench.workloads.distributions import Dist, parse_dist
from cbbench.workloads.errors import WorkloadError
from cbbench.workloads.graph import GraphCall
from cbbench.workloads.spec import RequestSpec, Workload

KEYS = ("fan_out", "depth", "system", "tools", "task", "plan", "subtask", "step", "result",
        "answer", "tool_ms")  # fmt: skip
DEFAULTS: dict[str, dict] = {
    "fan_out": {"dist": "uniform", "min": 2, "max": 6},
    "depth": {"dist": "uniform", "min": 1, "max": 3},
    "system": {"dist": "constant", "value": 256},
    "tools": {"dist": "constant", "value": 4},
    "task": {"dist": "lognormal", "median": 100, "sigma": 0.6, "min": 8, "max": 2048},
    "plan": {"dist": "lognormal", "median": 60, "sigma": 0.4, "min": 8, "max": 512},
    "subtask": {"dist": "lognormal", "median": 30, "sigma": 0.4, "min": 4, "max": 256},
    "step": {"dist": "lognormal", "median": 40, "sigma": 0.4, "min": 4, "max": 512},
    "result": {"dist": "lognormal", "median": 200, "sigma": 0.8, "min": 8, "max": 4096},
    "answer": {"dist": "lognormal", "median": 150, "sigma": 0.5, "min": 8, "max": 2048},
    "tool_ms": {"dist": "lognormal", "median": 500, "sigma": 1.0, "min": 10, "max": 30000},
}
STREAM = 60  # the seed streams of this generator (agent.py's are 20-30)
TOOL_SIZE = {"dist": "constant", "value": 40}


def _parse(spec: object, where: str) -> dict[str, Dist]:
    if not isinstance(spec, dict):
        raise WorkloadError(f"{where}: 'agent_graph' must be a table")
    for key in spec:
        if key not in KEYS:
            raise WorkloadError(
                f"{where}: agent_graph: unknown key '{key}' (keys: {', '.join(KEYS)})"
            )
    return {
        k: parse_dist(spec.get(k, DEFAULTS[k]), f"{where}: agent_graph: {k}",
                      default_min=0 if k == "tool_ms" else 1)
        for k in KEYS
    }  # fmt: skip


class _Session:
    """One session's calls as they are built (indices are workload-wide)."""

    def __init__(self, sid: str, base: int) -> None:
        self.sid, self.base = sid, base
        self.calls: list[RequestSpec] = []

    def add(self, msgs: list[dict], live, after, out: int, wait, depth: int, name: str,
            tools: str = "") -> int:  # fmt: skip
        index = self.base + len(self.calls)
        words = sum(len((m.get("content") or "").split()) for m in msgs)
        self.calls.append(
            RequestSpec(
                index=index,
                prompt_len=max(1, words),
                output_len=max(1, int(out)),
                session_id=self.sid,
                turn=len(self.calls) + 1,
                think_s=wait,
                graph=GraphCall(tuple(after), json.dumps(msgs), tuple(live), tools, name, depth),
            )
        )
        return index


def build_agent_graph(spec: object, name: str, seed: int, n: int, where: str) -> Workload:
    p = _parse(spec, where)
    r = np.random.default_rng([seed, STREAM])
    words_rng = np.random.default_rng([seed, STREAM, 1])

    def draw(key: str) -> int:
        return int(p[key].sample(r, 1)[0])

    tools_list = _tools(np.random.default_rng([seed, STREAM, 2]), draw("tools"),
                        parse_dist(TOOL_SIZE, "tool size"))  # fmt: skip
    tools = json.dumps(tools_list)
    names = [t["function"]["name"] for t in tools_list]
    system_orch = {"role": "system", "content": "orchestrator " + _words(words_rng, draw("system"))}
    system_sub = {"role": "system", "content": "sub-agent " + _words(words_rng, draw("system"))}
    requests: list[RequestSpec] = []
    s = 0
    while len(requests) < n:
        sess = _Session(f"g{s}", len(requests))
        k_subs = max(1, draw("fan_out"))
        task = {"role": "user", "content": _words(words_rng, draw("task"))}
        orch_msgs = [system_orch, task]
        orch = sess.add(orch_msgs, (), (), draw("plan"), None, 0, "orchestrator")
        delegations = [
            {"id": f"task_{s}_{k}", "type": "function",
             "function": {"name": "delegate", "arguments": json.dumps({"sub_agent": k})}}
            for k in range(k_subs)
        ]  # fmt: skip
        plan = {"role": "assistant", "content": "", "tool_calls": delegations}
        finals: list[int] = []
        for k in range(k_subs):
            sub = {
                "role": "user",
                "content": f"sub-task {k}: " + _words(words_rng, draw("subtask")),
            }
            msgs = [system_sub, task, plan, sub]
            live = [(2, orch)]
            prev, depth = orch, 1
            wait: float | None = 0.0
            for step in range(max(1, draw("depth"))):
                if step:
                    call_id = f"call_{s}_{k}_{step}"
                    name_i = names[int(r.integers(0, len(names)))]
                    msgs = [
                        *msgs,
                        {"role": "assistant", "content": "", "tool_calls": [
                            {"id": call_id, "type": "function",
                             "function": {"name": name_i, "arguments": '{"query": "x"}'}}]},
                        {"role": "tool", "tool_call_id": call_id,
                         "content": _words(words_rng, draw("result"))},
                    ]  # fmt: skip
                    live = [*live, (len(msgs) - 2, prev)]
                    wait = draw("tool_ms") / 1000.0
                prev = sess.add(msgs, live, (prev,), draw("step"), wait, depth,
                                f"sub{k}.{step + 1}", tools)  # fmt: skip
                depth += 1
            finals.append(prev)
        results = [{"role": "tool", "tool_call_id": d["id"], "content": ""} for d in delegations]
        msgs = [system_orch, task, plan, *results]
        live = [(2, orch), *((3 + k, f) for k, f in enumerate(finals))]
        top = max(sess.calls[f - sess.base].graph.depth for f in finals)
        sess.add(msgs, live, finals, draw("answer"), 0.0, top + 1, "reducer")
        requests.extend(sess.calls)
        s += 1
    requests = requests[:n]
    counts: dict[str, int] = {}
    for q in requests:
        counts[q.session_id] = counts.get(q.session_id, 0) + 1  # type: ignore[index]
    requests = [
        dataclasses.replace(q, graph=dataclasses.replace(q.graph, calls=counts[q.session_id]))  # type: ignore[arg-type,index]
        for q in requests
    ]
    return Workload(
        name=name,
        seed=seed,
        requests=tuple(requests),
        source={"format": "agent-graph", "sessions": len(counts)},
    )
