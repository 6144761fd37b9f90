"""Server errors and their OpenAI-style bodies.

Every error a client can cause becomes `{"error": {"message", "type", "param", "code"}}`
with a 4xx status; messages are truncated so they never echo unbounded input.
"""

from __future__ import annotations

from typing import Any

MAX_MESSAGE_CHARS = 300


def truncate(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class QueueFull(Exception):
    """The engine's waiting queue is at its limit: HTTP 429."""


class ShuttingDown(Exception):
    """The server is stopping (or the engine died): in-flight requests end with this."""


class APIError(Exception):
    """An HTTP error with an OpenAI-style body."""

    def __init__(
        self,
        status_code: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status_code = status_code
        self.message = truncate(message)
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str, type: str, param: str | None = None, code: str | int | None = None
) -> dict[str, Any]:
    return {"error": {"message": truncate(message), "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def model_not_found(asked: str, served: str) -> APIError:
    """A request named a model this server does not serve: 404, as OpenAI and vLLM answer."""
    return APIError(
        404,
        f"model {asked!r} is not served here (serving {served!r})",
        param="model",
        code="model_not_found",
    )
