"""Synthetic agent sessions: a system prompt and a `tools` list, a task, then K tool-calling
steps and a final answer (spec key `agent`, preset `agent`).

Per session: a tool set (one of `tool_sets` agent configurations: system prompt + tools, shared
by every session that draws it, as one agent app serves many tasks), a task message, K steps
(K from `steps`). Step k's reply is a short `tool_calls` turn (its output length from `call`,
its arguments about `arguments` words), then the tool runs (`tool_ms`, outside every latency),
then its result (`result` tokens) is the next request's new message; the last step's reply is
the final answer (`answer` tokens). Every request resends the whole history.

Defaults and where their shapes come from (docs/agents.md says more):
- steps lognormal median 12 (2-60): SWE-agent style coding agents take tens of steps, most
  chat-tool sessions a handful;
- tool results lognormal median 400 tokens with a long tail (file reads, search results);
- tool calls lognormal median 40 tokens, final answers median 200: Mooncake's tool&agent trace
  (FAST'25) reports short outputs (about 180 tokens on average) against long inputs;
- tool latency lognormal median 1 s (10 ms-60 s): API calls and sandboxed commands.

Every field draws from its own seeded stream, so the same spec and seed give the same sessions.
"""

from __future__ import annotations

import json

import numpy as np
from cbbench.workloads.distributions import Dist, parse_dist
from cbbench.workloads.errors import WorkloadError
from cbbench.workloads.spec import AgentStep, RequestSpec, ToolCall, Workload

AGENT_KEYS = (
    "steps", "system", "tool_sets", "tools", "tool_tokens", "task", "call", "arguments",
    "answer", "result", "tool_ms",
)  # fmt: skip
DEFAULTS: dict[str, dict | int] = {
    "steps": {"dist": "lognormal", "median": 12, "sigma": 0.5, "min": 2, "max": 60},
    "system": {"dist": "constant", "value": 512},
    "tool_sets": 1,
    "tools": {"dist": "uniform", "min": 4, "max": 12},
    "tool_tokens": {"dist": "lognormal", "median": 100, "sigma": 0.4, "min": 20, "max": 600},
    "task": {"dist": "lognormal", "median": 150, "sigma": 0.7, "min": 8, "max": 2048},
    "call": {"dist": "lognormal", "median": 40, "sigma": 0.4, "min": 8, "max": 256},
    "arguments": {"dist": "lognormal", "median": 16, "sigma": 0.5, "min": 2, "max": 200},
    "answer": {"dist": "lognormal", "median": 200, "sigma": 0.6, "min": 16, "max": 2048},
    "result": {"dist": "lognormal", "median": 400, "sigma": 1.0, "min": 8, "max": 8192},
    "tool_ms": {"dist": "lognormal", "median": 1000, "sigma": 1.0, "min": 10, "max": 60000},
}
STREAMS = {k: 20 + i for i, k in enumerate(AGENT_KEYS)}  # 1-9: synthetic.py's
SYSTEM_BLOCK = 64  # tokens per prefix id of the system prompt
WORDS = (
    "file", "path", "query", "search", "read", "write", "list", "run", "test", "result",
    "value", "name", "index", "line", "error", "code", "data", "user", "page", "item",
)  # fmt: skip


def _words(rng: np.random.Generator, n: int) -> str:
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), size=max(1, n)))


def _tools(rng: np.random.Generator, count: int, size: Dist) -> list[dict]:
    """`count` function tools, each about its drawn size in tokens (one per word)."""
    sizes = size.sample(rng, count)
    out = []
    for i, n in enumerate(sizes.tolist()):
        out.append(
            {
                "type": "function",
                "function": {
                    "name": f"tool_{i}",
                    "description": _words(rng, max(1, n - 20)),
                    "parameters": {
                        "type": "object",
                        "properties": {"query": {"type": "string", "description": "the input"}},
                        "required": ["query"],
                    },
                },
            }
        )
    return out


def _parse(spec: object, where: str) -> tuple[dict[str, Dist], int]:
    """The table's distributions (defaults filled in) and its number of tool sets."""
    if not isinstance(spec, dict):
        raise WorkloadError(f"{where}: 'agent' must be a table")
    for key in spec:
        if key not in AGENT_KEYS:
            raise WorkloadError(
                f"{where}: agent: unknown key '{key}' (keys: {', '.join(AGENT_KEYS)})"
            )
    sets = spec.get("tool_sets", DEFAULTS["tool_sets"])
    if isinstance(sets, bool) or not isinstance(sets, int) or sets < 1:
        raise WorkloadError(f"{where}: agent: 'tool_sets' must be an integer >= 1, got {sets!r}")
    dists = {
        key: parse_dist(
            spec.get(key, DEFAULTS[key]),
            f"{where}: agent: {key}",
            default_min=0 if key == "tool_ms" else 1,
        )
        for key in AGENT_KEYS
        if key != "tool_sets"
    }
    return dists, sets


def build_agent(spec: object, name: str, seed: int, n: int, where: str) -> Workload:
    """n requests of agent sessions (the last session is cut short at n, ending in its answer)."""
    p, sets = _parse(spec, where)

    def rng(key: str, *more: int) -> np.random.Generator:
        return np.random.default_rng([seed, STREAMS[key], *more])

    system = p["system"].sample(rng("system"), sets)
    counts = p["tools"].sample(rng("tools"), sets)
    tool_sets = []
    for t in range(sets):  # tool set t's system prompt: prefix ids t * 4096 + block
        tools = _tools(rng("tool_tokens", t), int(max(1, counts[t])), p["tool_tokens"])
        blocks = -(-int(system[t]) // SYSTEM_BLOCK)
        if blocks >= 4096:
            raise WorkloadError(
                f"{where}: agent: system prompt of {int(system[t])} tokens is over "
                f"{4096 * SYSTEM_BLOCK - 1}"
            )
        ids = tuple(t * 4096 + b for b in range(blocks))
        tool_sets.append((json.dumps(tools), int(system[t]), ids))
    draws = {k: p[k].sample(rng(k), n) for k in ("task", "call", "answer", "result", "tool_ms")}
    steps = p["steps"].sample(rng("steps"), n)  # one per session (there are at most n)
    pick_set = rng("tool_sets").integers(0, sets, size=n)
    arg_rng = rng("arguments", 1)
    arg_len = p["arguments"].sample(rng("arguments"), n)
    requests: list[RequestSpec] = []
    session = 0
    while len(requests) < n:
        tools, sys_len, prefix = tool_sets[int(pick_set[session])]
        names = [t["function"]["name"] for t in json.loads(tools)]
        k_steps = max(1, int(steps[session]))
        answered: str | None = None
        for k in range(1, k_steps + 1):
            i = len(requests)
            last = k == k_steps or i == n - 1
            call = None
            if not last:
                args = json.dumps({"query": _words(arg_rng, int(arg_len[i]))})
                name_i = names[int(arg_rng.integers(0, len(names)))]
                call = ToolCall(f"call_{session}_{k}", name_i, args)
            requests.append(
                RequestSpec(
                    index=i,
                    prompt_len=int(draws["task"][i] if k == 1 else draws["result"][i]),
                    output_len=int(draws["answer"][i] if last else draws["call"][i]),
                    prefix_ids=prefix if k == 1 else (),
                    session_id=f"a{session}",
                    turn=k,
                    think_s=None if k == 1 else max(0, int(draws["tool_ms"][i])) / 1000.0,
                    agent=AgentStep(tools, sys_len, call, answered),
                )
            )
            answered = call.id if call else None
            if last:
                break
        session += 1
    return Workload(
        name=name,
        seed=seed,
        requests=tuple(requests),
        prefix_block_size=SYSTEM_BLOCK,
        source={"format": "agent", "sessions": session, "tool_sets": sets},
    )
