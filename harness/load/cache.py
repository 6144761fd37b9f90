"""The prefix cache around a run: `--flush-cache` empties the server's cache before it, `--prime`
sends each distinct shared prefix once (unmeasured) so the run starts from a known state, and
`--session-header` names the header that carries a session's id (routers pin sessions by it).

Flush: vLLM's `POST /reset_prefix_cache`, else SGLang's `POST /flush_cache` (the reference
engine answers both). Prime: for each distinct leading prefix (the prefix ids of a first turn;
an agent tool set's system prompt and tools), one request of that prefix and nothing else,
`max_tokens` 1; the run's requests then find it cached. Both run before t0, outside every
measurement, and say in run.json what they did.
"""

from __future__ import annotations

import json

import httpx
from cbbench.harness.client import aio
from cbbench.harness.client.api import ClientConfig, OpenAIClient
from cbbench.harness.client.endpoints import is_conversational
from cbbench.harness.errors import CbbenchError
from cbbench.harness.load.agent import check_agent_endpoint as agent_endpoint
from cbbench.harness.load.cache_options import CacheOptions, add_cache_args
from cbbench.harness.load.prompts import PromptBuilder
from cbbench.harness.load.text_fit import TextFit
from cbbench.harness.results.records import RequestRecord
from cbbench.workloads.spec import Workload

RESET_PATHS = ("/reset_prefix_cache", "/flush_cache")  # vLLM's, SGLang's
__all__ = [
    "CacheOptions",
    "add_cache_args",
    "flush_prefix_cache",
    "prepare_cache",
    "prime_prefixes",
]


def flush_prefix_cache(base_url: str, api_key: str | None, timeout_s: float = 30.0) -> str:
    """POST the reset endpoints in turn; the path that answered 2xx, else CbbenchError."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    answers = []
    for path in RESET_PATHS:
        try:
            r = httpx.post(base_url + path, headers=headers, timeout=timeout_s, trust_env=False)
        except httpx.HTTPError as exc:
            answers.append(f"{path}: {type(exc).__name__}")
            continue
        if r.status_code < 300:
            return path
        answers.append(f"{path}: HTTP {r.status_code}")
    raise CbbenchError(
        f"--flush-cache: {base_url} empties no prefix cache ({'; '.join(answers)}); vLLM "
        "serves /reset_prefix_cache with VLLM_SERVER_DEV_MODE=1, SGLang /flush_cache"
    )


def _prime_prompts(
    wl: Workload, text: bool, tokenizer: str | None = None, text_fit: TextFit | None = None
) -> list[tuple[str, object]]:
    """(what, prompt) of each distinct leading prefix of `wl`, in first-seen order."""
    # as the workers build them: the workload's prompt seed, the server's text fit
    prompts = PromptBuilder(wl.prompt_seed, wl.prefix_block_size, tokenizer, text_fit=text_fit)
    seen: set = set()
    out: list[tuple[str, object]] = []
    for r in wl.requests:
        if (r.turn or 1) > 1 or not r.prefix_ids:
            continue
        agent = r.agent
        key = (tuple(r.prefix_ids), agent.tools if agent is not None else None)
        if key in seen:
            continue
        seen.add(key)
        if agent is not None:
            system = prompts.text(r.index, agent.system_len, tuple(r.prefix_ids))
            messages = [{"role": "system", "content": system}, {"role": "user", "content": "."}]
            out.append(
                (
                    f"tool set of request {r.index}",
                    {"messages": messages, "tools": json.loads(agent.tools)},
                )
            )
            continue
        n = min(r.prompt_len, len(r.prefix_ids) * wl.prefix_block_size)
        build = prompts.text if text else prompts.token_ids
        out.append((f"prefix of request {r.index}", build(r.index, n, tuple(r.prefix_ids))))
    return out


def prime_prefixes(
    client: ClientConfig,
    wl: Workload,
    text: bool = False,
    tokenizer: str | None = None,
    text_fit: TextFit | None = None,
) -> int:
    """Send each distinct prefix once (max_tokens 1), one after another; how many were sent.
    A failed one is a CbbenchError naming it (the run would measure a cold cache)."""
    todo = _prime_prompts(wl, text or is_conversational(client.endpoint), tokenizer, text_fit)
    if not todo:
        return 0

    async def main() -> None:
        c = OpenAIClient(ClientConfig(**{**client.__dict__, "session_header": None}))
        try:
            for i, (what, prompt) in enumerate(todo):
                rec = RequestRecord(id=f"cbb-prime{i}", index=i, prompt_len=0, output_len=1)
                await c.send(rec, prompt)
                if not rec.ok:
                    raise CbbenchError(f"--prime: the {what} failed: {rec.error or rec.status}")
        finally:
            await c.aclose()

    aio.run(main())
    return len(todo)


def check_agent_endpoint(endpoint: str, wl: Workload) -> None:
    """Agent sessions need an API with tools: chat, responses or messages (CbbenchError
    otherwise)."""
    agent_endpoint(endpoint, any(r.agent is not None or r.graph is not None for r in wl.requests))


def prepare_cache(
    opts: CacheOptions,
    client: ClientConfig,
    wl: Workload,
    text: bool = False,
    tokenizer: str | None = None,
    text_fit: TextFit | None = None,
) -> dict:
    """Flush, then prime, as `opts` ask (before t0: nothing of it is measured); for run.json."""
    meta: dict = {"session_header": client.session_header}
    if opts.flush_cache:
        meta["flushed"] = flush_prefix_cache(client.base_url, client.api_key)
    if opts.prime:
        meta["primed_prefixes"] = prime_prefixes(client, wl, text, tokenizer, text_fit)
    return meta
