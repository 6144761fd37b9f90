"""Requests that cannot fit the server's context are not sent as they are: `bench` reads
`max_model_len` from `/v1/models` (vLLM and the reference server say it) and fits the workload
to it before t0, as vLLM's benchmark filters its datasets, saying how many it changed:

- a lone request whose prompt fits but whose prompt + output does not gets its output
  clamped to the room left (max_tokens = max_model_len - prompt);
- one whose prompt alone does not fit is skipped;
- a session (multi-turn, agent) carries its history: turn k's context is every earlier
  prompt and reply plus its own prompt. The turn whose output would overflow is clamped; a
  turn whose prompt would overflow is skipped with the rest of its session (there is no
  reply to build on).

Chat-style endpoints wrap every message in a template and agent steps resend the system
prompt and the tools list: `overhead` tokens per turn is the server's template cost of one
message (measured through /tokenize, plus a margin; 32 where it cannot be measured), the tools' and tool
calls' text is counted by the server's /tokenize where it has one (else a token a character); a request the server still refuses is counted as a failure, as
before. A server that does not say its max_model_len leaves the workload as it is.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from cbbench.harness.client.endpoints import is_conversational
from cbbench.harness.errors import CbbenchError
from cbbench.harness.load.text_fit import _Tokenize
from cbbench.workloads.spec import RequestSpec, Workload

CHAT_OVERHEAD_TOKENS = 32  # per message, when the server cannot measure its template
TEMPLATE_MARGIN_TOKENS = 8  # ... added to the measured one (a reply's own markers)


@dataclass
class ContextFit:
    max_model_len: int
    requests: int  # in the workload as given
    clamped: int = 0  # outputs cut to the room left
    skipped: int = 0  # prompts that could not fit (and the later turns of their sessions)
    sessions_cut: int = 0  # sessions ended early at the turn that would overflow

    @property
    def changed(self) -> bool:
        return bool(self.clamped or self.skipped)

    def line(self) -> str:
        cut = f" ({self.sessions_cut} sessions ended there)" if self.sessions_cut else ""
        return (
            f"the server's max_model_len is {self.max_model_len}: {self.clamped + self.skipped} "
            f"of {self.requests} requests would not fit: {self.clamped} outputs clamped to the "
            f"room left, {self.skipped} skipped (the prompt, with its history, does not fit)"
            f"{cut}"
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def fit_to_context(
    wl: Workload,
    max_model_len: int,
    overhead: int = 0,
    count: Callable[[str], int | None] | None = None,
) -> tuple[Workload, ContextFit]:
    """`wl` with what cannot fit clamped or skipped (module docstring); the count of each.
    `count`: the server's token count of a text (its /tokenize), for what agent steps send
    besides their prompt; without it, one token a character (the safe side)."""
    fit = ContextFit(max_model_len, len(wl))
    counted: dict[str, int] = {}

    def tokens(text: str) -> int:
        if text not in counted:
            n = count(text) if count is not None else None
            counted[text] = n if isinstance(n, int) else len(text)
        return counted[text]

    def fixed(r: RequestSpec) -> int:
        """What an agent step sends every time besides its history: the system prompt and
        the tools list."""
        return 0 if r.agent is None else r.agent.system_len + tokens(r.agent.tools)

    def reply(r: RequestSpec) -> int:
        """What a step's reply adds to the history: its tokens, or its tool call's text."""
        call = r.agent.call if r.agent is not None else None
        return max(r.output_len, tokens(str(call)) if call is not None else 0)

    sessions: dict[str, list[RequestSpec]] = defaultdict(list)
    for r in wl.requests:
        if r.session_id is not None:
            sessions[r.session_id].append(r)
    kept: dict[int, RequestSpec | None] = {}
    for r in wl.requests:
        if r.session_id is None:
            kept[r.index] = _fit_one(r, fixed(r), max_model_len, overhead, fit)
    for turns in sessions.values():
        if any(r.graph is not None for r in turns):  # each call sends its whole context
            _fit_graph(turns, max_model_len, overhead, tokens, fit, kept, count is not None)
            continue
        history = 0
        for k, r in enumerate(sorted(turns, key=lambda t: t.turn or 0)):
            fitted = _fit_one(r, history + fixed(r), max_model_len, overhead, fit)
            kept[r.index] = fitted
            if fitted is None:  # the rest of the session has nothing to build on
                rest = sorted(turns, key=lambda t: t.turn or 0)[k + 1 :]
                for later in rest:
                    kept[later.index] = None
                fit.skipped += len(rest)
                fit.sessions_cut += 1
                break
            history += fitted.prompt_len + overhead + reply(fitted)
    if not fit.changed:
        return wl, fit
    requests = tuple(r for r in (kept[x.index] for x in wl.requests) if r is not None)
    if not requests:
        raise CbbenchError(
            f"no request of {wl.name} fits the server's max_model_len {max_model_len}: a "
            "workload of shorter prompts (for agents docs/specs/agent-small.toml), or a server "
            "with a longer context"
        )
    return dataclasses.replace(wl, requests=requests), fit


def _fit_graph(
    calls: list[RequestSpec],
    limit: int,
    overhead: int,
    tokens: Callable[[str], int],
    fit: ContextFit,
    kept: dict[int, RequestSpec | None],
    counted: bool = False,
) -> None:
    """An agent graph's calls: each sends its recorded messages, the live answers of the
    calls it quotes (at most their output_len) and its tools; a call that cannot fit is
    skipped with every call after it that needs its answer; the session's call count follows.
    `counted`: `tokens` is the server's tokenizer, so the recorded messages are counted with
    it (their prompt_len is the trace's tokenizer's count: tiny's counted 1,657 tokens where
    the trace said 299, and 10 of 12 calls got HTTP 400 instead of being skipped here)."""
    out = {r.index: r.output_len for r in calls}
    gone: set[int] = set()
    fitted: dict[int, RequestSpec | None] = {}
    for r in sorted(calls, key=lambda c: c.index):  # predecessors come first
        g = r.graph
        assert g is not None, "a graph session mixes in a call without its graph"
        if gone & set(g.after) or any(src in gone for _, src in g.live):
            fitted[r.index] = None
            gone.add(r.index)
            fit.skipped += 1
            continue
        extra = sum(out[src] for _, src in g.live) + (tokens(g.tools) if g.tools else 0)
        n_messages = g.messages.count('"role"')
        if counted:  # what this server's tokenizer makes of the text sent, where more
            extra += max(0, _message_tokens(g.messages, tokens) - r.prompt_len)
        one = _fit_one(r, extra + overhead * max(0, n_messages - 1), limit, overhead, fit)
        fitted[r.index] = one
        if one is None:
            gone.add(r.index)
        else:
            out[r.index] = one.output_len
    if gone:
        fit.sessions_cut += 1
    left = sum(one is not None for one in fitted.values())
    for index, one in fitted.items():
        if one is not None and gone:
            one = dataclasses.replace(one, graph=dataclasses.replace(one.graph, calls=left))
        kept[index] = one


def _message_tokens(messages: str, tokens: Callable[[str], int]) -> int:
    """The tokens of a recorded call's messages (a JSON list): each content, and any tool
    calls' JSON, counted by `tokens` (the chat template's cost is the caller's overhead)."""
    try:
        parsed = json.loads(messages)
    except ValueError:
        return tokens(messages)
    total = 0
    for m in parsed if isinstance(parsed, list) else [parsed]:
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if content:
            total += tokens(content if isinstance(content, str) else json.dumps(content))
        if m.get("tool_calls"):
            total += tokens(json.dumps(m["tool_calls"]))
    return total


def _fit_one(
    r: RequestSpec, history: int, limit: int, overhead: int, fit: ContextFit
) -> RequestSpec | None:
    context = history + r.prompt_len + overhead
    if context >= limit:
        fit.skipped += 1
        return None
    if context + r.output_len > limit:
        fit.clamped += 1
        return dataclasses.replace(r, output_len=limit - context)
    return r


def fit_for_server(
    wl: Workload,
    max_model_len: object,
    endpoint: str,
    base_url: str,
    model: str,
    api_key: str | None,
) -> tuple[Workload, ContextFit | None]:
    """`fit_to_context` for the server `bench` probed: its max_model_len (None: unknown, the
    workload as it is), its chat template's cost a message and its count of the agent tools'
    text, both through its /tokenize where it has one."""
    if not isinstance(max_model_len, int) or endpoint == "embeddings":
        return wl, None
    tk = _Tokenize(base_url, model, api_key, 10.0)

    def count(text: str | None = None, messages: list | None = None) -> int | None:
        try:
            return tk.count(text, messages)
        except (httpx.HTTPError, ValueError):
            return None

    overhead = 0
    if is_conversational(endpoint):  # the template around a message, measured, else assumed
        one, bare = count(messages=[{"role": "user", "content": "hello"}]), count("hello")
        overhead = (
            max(0, one - bare) + TEMPLATE_MARGIN_TOKENS
            if isinstance(one, int) and isinstance(bare, int)
            else CHAT_OVERHEAD_TOKENS
        )
    agents = any(r.agent is not None for r in wl.requests)
    return fit_to_context(wl, max_model_len, overhead, count if agents else None)
