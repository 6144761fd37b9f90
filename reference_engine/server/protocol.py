"""Request schemas (OpenAI's, with vLLM's extensions) and response shapes.

The schemas are strict: a field of the wrong JSON type is a 400, not a silent coercion.
Unknown fields are ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
INT64_MAX = 2**63 - 1
INT32 = 2**31 - 1

# Completions without max_tokens generate this many tokens (OpenAI's default); chat
# completions without it may fill the context, as vLLM does.
DEFAULT_COMPLETION_MAX_TOKENS = 16


def _valid_unicode(text: str) -> str:
    """JSON may carry lone surrogates (`"\\ud800"`); they cannot be encoded, tokenized or
    echoed, so they are a 400 naming the field."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        raise ValueError(
            f"lone surrogate U+{code:04X} at character {exc.start} (not valid Unicode)"
        ) from None
    return text


# Every string the server reads: valid Unicode, so encoding and error bodies never fail.
Text = Annotated[str, AfterValidator(_valid_unicode)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False


class SamplingFields(_Strict):
    """Fields shared by both endpoints."""

    model: Text | None = Field(None, max_length=1024)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=100.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(-1, ge=-1)  # -1 or 0 = off
    seed: int | None = Field(None, ge=0, le=INT64_MAX)
    stop: Text | list[Text] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    n: int = Field(1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    priority: int = Field(0, ge=-INT32, le=INT32)
    return_token_ids: bool = False
    user: Text | None = None
    # prefill/decode disaggregation (server/disagg.py): which hop this request is
    kv_transfer_params: dict[str, Any] | None = None

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return tuple(s for s in stops if s)


MAX_LOGPROBS = 20  # top alternatives per token, as vLLM's default max_logprobs


class CompletionRequest(SamplingFields):
    prompt: Text | list[Annotated[int, Field(ge=0)]] = Field(..., min_length=1)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)  # top-k alternatives per token
    echo: bool = False  # the prompt starts the returned text


class TextPart(_Strict):
    type: Literal["text"]
    text: Text


class ToolCallFunction(_Strict):
    name: Text = Field(..., max_length=256)
    arguments: Text


class ToolCallItem(_Strict):
    id: Text = Field(..., min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(_Strict):
    role: Text = Field(..., min_length=1, max_length=64)
    content: Text | list[TextPart] | None = None
    tool_calls: list[ToolCallItem] | None = None  # an assistant message's calls
    tool_call_id: Text | None = Field(None, max_length=256)  # a tool message: the call answered

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(..., min_length=1)
    tools: list[dict[str, Any]] | None = None  # rendered into the prompt (server/tools.py)
    max_completion_tokens: int | None = Field(None, ge=1)
    # reasoning models (server/reasoning.py): effort scales the reasoning share; a template
    # kwarg `enable_thinking: false` turns it off (Qwen3's); other kwargs are accepted
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


# --- responses --------------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def cbbench_info(
    queue_time_s: float | None,
    scheduler: str,
    num_preemptions: int,
    num_cached_tokens: int,
    num_draft_tokens: int = 0,
    num_accepted_tokens: int = 0,
    prefill_time_s: float | None = None,
    decode_time_s: float | None = None,
) -> dict[str, Any]:
    """The `cbbench` field of a final chunk or a non-streaming body: what the server saw
    (speculative decoding: draft tokens the target scored for this request, and accepted;
    first scheduled -> first token, and first token -> finished, on the engine's clock)."""
    return {
        "prefill_time_s": prefill_time_s,
        "decode_time_s": decode_time_s,
        "queue_time_s": queue_time_s,
        "scheduler": scheduler,
        "num_preemptions": num_preemptions,
        "num_cached_tokens": num_cached_tokens,
        "num_draft_tokens": num_draft_tokens,
        "num_accepted_tokens": num_accepted_tokens,
    }


def completion_choice(
    text: str,
    finish_reason: str | None,
    token_ids: list[int] | None,
    prompt_token_ids: list[int] | None,
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
    }
    if token_ids is not None:
        choice["token_ids"] = token_ids
    if prompt_token_ids is not None:
        choice["prompt_token_ids"] = prompt_token_ids
    return choice


def chat_choice(
    delta: dict[str, Any] | None,
    message: dict[str, Any] | None,
    finish_reason: str | None,
    token_ids: list[int] | None,
    prompt_token_ids: list[int] | None,
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
    if delta is not None:
        choice["delta"] = delta
    if message is not None:
        choice["message"] = message
    if token_ids is not None:
        choice["token_ids"] = token_ids
    if prompt_token_ids is not None:
        choice["prompt_token_ids"] = prompt_token_ids
    return choice


def envelope(request_id: str, object_: str, model: str, created: int | None = None) -> dict:
    return {
        "id": request_id,
        "object": object_,
        "created": created if created is not None else int(time.time()),
        "model": model,
    }


# The error body every 4xx carries (documented in the OpenAPI schema).
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string", "maxLength": 300},
                "type": {"type": "string"},
                "param": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "code": {"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]},
            },
        }
    },
}
