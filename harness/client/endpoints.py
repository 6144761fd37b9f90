"""The APIs the client speaks, one name each (`--endpoint`), and what differs between them:
the path, the request body, and how a response's events map onto the one shape the response
handler folds (a chat chunk: `choices[0].delta` with content / reasoning / tool_calls, and
`usage` in chat's names), so the stream classifier (`stream_kinds.py`), TTFT, TTFO and token
counts mean the same on every endpoint.

- `completions`, `chat`: OpenAI's; folded as they come.
- `responses` (`responses.py`): OpenAI's Responses API.
- `messages` (`messages.py`): Anthropic's Messages API.
- `embeddings` (`embeddings.py`): a batch of inputs per request, never streamed.

Multi-turn sessions resend the whole conversation on every endpoint that takes one (chat,
responses, messages): `input` / `messages` carry the history, never `previous_response_id`,
so a turn costs the same on a server that keeps no state.
"""

from __future__ import annotations

ENDPOINTS = ("completions", "chat", "responses", "messages", "embeddings")
PATHS = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
    "embeddings": "/v1/embeddings",
}
CONVERSATIONAL = frozenset({"chat", "responses", "messages"})  # take a message list, as chat
ANTHROPIC_VERSION = "2023-06-01"


def path(endpoint: str) -> str:
    assert endpoint in PATHS, endpoint
    return PATHS[endpoint]


def is_conversational(endpoint: str) -> bool:
    """Whether the endpoint takes a conversation (text prompts, chat-shaped history)."""
    return endpoint in CONVERSATIONAL


def auth_headers(endpoint: str, api_key: str | None) -> dict[str, str]:
    """The key as the API wants it: Anthropic's `x-api-key` (with `anthropic-version`, always
    sent), else a Bearer token."""
    if endpoint == "messages":
        head = {"anthropic-version": ANTHROPIC_VERSION}
        return {**head, "x-api-key": api_key} if api_key else head
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


def adapter(endpoint: str):
    """The endpoint's event adapter (None: the response is folded as it comes)."""
    if endpoint == "responses":
        from cbbench.harness.client import responses

        return responses.ADAPTER
    if endpoint == "messages":
        from cbbench.harness.client import messages

        return messages.ADAPTER
    if endpoint == "embeddings":
        from cbbench.harness.client import embeddings

        return embeddings.ADAPTER
    return None
