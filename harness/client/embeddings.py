"""Embeddings (`/v1/embeddings`: OpenAI's, vLLM's pooling runner, TEI's OpenAI route) on the
client's one fast path: a batch of inputs per request, never streamed.

The request's `input` is a batch of `--embeddings-batch` inputs (default 1) made from the
request's prompt: token ids (the default, as vLLM and OpenAI accept them) or text
(`--text-prompts`); input i is the prompt turned left by i tokens (or words), so the inputs
of a batch differ and share no prefix. The response must hold one float vector per input
(else the request fails as `protocol`); `usage.prompt_tokens` is the batch's input tokens.

A record has no output tokens (`output_len` 0) and no TTFT; its client prompt count is the
batch's (the prompt's times the inputs). `e2e_s` is the request's latency, `extra` holds
`inputs` (the batch size) and `dims` (the vector length); a run's inputs/s is its requests/s
times the batch, its tokens/s `total_token_throughput` (input tokens, as there is no output).
"""

from __future__ import annotations

from cbbench.harness.client.response import RequestFailed

END_EVENT = "a JSON body"


def inputs(prompt, n: int) -> list:
    """`n` inputs from one prompt: the prompt turned left by 0 .. n-1 tokens (or words)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        prompt = "\n".join(str(m.get("content", "")) for m in prompt)  # a conversation's text
    if isinstance(prompt, str):
        words = prompt.split(" ")
        return [" ".join(words[i % len(words) :] + words[: i % len(words)]) for i in range(n)]
    m = max(1, len(prompt))
    return [list(prompt[i % m :]) + list(prompt[: i % m]) for i in range(n)]


def payload(cfg, prompt, rec) -> dict:
    n = max(1, getattr(cfg, "embeddings_batch", 1))
    rec.extra["inputs"] = n
    return {"model": cfg.model, "input": inputs(prompt, n), "encoding_format": "float"}


def event(ev: dict, state: dict) -> dict | None:
    raise RequestFailed("protocol", "embeddings responses are not streamed")


def body(obj: dict, state: dict) -> None:
    """Check the vectors; keep their count and length, and the usage."""
    data = obj.get("data")
    if not isinstance(data, list) or not data:
        raise RequestFailed("protocol", "embeddings body without a data list")
    dims = None
    for item in data:
        vec = item.get("embedding") if isinstance(item, dict) else None
        if not isinstance(vec, list) or not vec or not isinstance(vec[0], int | float):
            raise RequestFailed("protocol", "embeddings item without a float vector")
        if dims is not None and len(vec) != dims:
            raise RequestFailed("protocol", "embeddings vectors of different lengths")
        dims = len(vec)
    state["embeddings"], state["dims"] = len(data), dims
    u = obj.get("usage")
    if isinstance(u, dict):
        state["usage_prompt"] = u.get("prompt_tokens")
    state["done"] = True


def finish(rec, resp) -> None:
    """The record of an embeddings request: latency, inputs, vector length."""
    state = resp.state
    rec.output_tokens_client = 0
    rec.output_tokens_server = None
    if "embeddings" not in state:
        return
    sent = resp.rec.extra.get("inputs")
    if sent is not None and sent != state["embeddings"]:
        from cbbench.harness.client.response import fail_record

        fail_record(rec, "protocol", f"{state['embeddings']} vectors for {sent} inputs")
        return
    rec.extra["inputs"] = n = state["embeddings"]
    rec.extra["dims"] = state["dims"]
    rec.output_len = 0  # nothing is generated: not a short output
    if rec.prompt_tokens_client is not None:  # the prompt, turned n ways: the batch's tokens
        rec.prompt_tokens_client *= n
    if rec.ok and rec.sent_s is not None and rec.end_s is not None:
        rec.e2e_s = rec.end_s - rec.sent_s
        rec.first_token_s = rec.last_token_s = rec.end_s


class _Adapter:
    end_event = END_EVENT
    payload = staticmethod(payload)
    event = staticmethod(event)
    body = staticmethod(body)
    finish = staticmethod(finish)
    streams = False


ADAPTER = _Adapter()
