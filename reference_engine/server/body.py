"""Request bodies: JSON bytes -> a validated request model, or a 400 that says why.

Parsing is CPU work under the GIL (json.loads of a 4 MiB list of token ids holds it for
~70 ms, validation as long again), so a thread would not keep the event loop answering:
bodies of `OFFLOAD_BYTES` or more are parsed and validated in one spawned worker process,
which sends back only the validated model (a token-id prompt longer than the context is
refused there, so no huge list ever crosses back). Smaller bodies are parsed in place.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import multiprocessing
import os
from dataclasses import dataclass
from typing import Any, TypeVar

from cbbench.reference_engine.server.errors import APIError, bad_request
from cbbench.reference_engine.server.lifeline import die_with_parent
from pydantic import BaseModel, ValidationError

OFFLOAD_BYTES = 64 * 1024

M = TypeVar("M", bound=BaseModel)

NOT_AN_OBJECT = "the request body must be a JSON object (Content-Type: application/json)"
_UNION_TAGS = {"body", "str", "int", "float", "bool", "none", "list", "dict"}


@dataclass(frozen=True)
class Rejected:
    """A 400 decided in the worker process (picklable, unlike APIError)."""

    message: str
    param: str | None = None
    code: str | None = None

    def error(self) -> APIError:
        return bad_request(self.message, self.param, self.code)


def is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    mime = content_type.split(";", 1)[0].strip().lower()
    return mime == "application/json" or (
        mime.startswith("application/") and mime.endswith("+json")
    )


def _is_field(part: object) -> bool:
    """Field names and indices in a validation error's location, without pydantic's union
    member tags (`str`, `list[int]`, `function-after[...]`)."""
    if isinstance(part, int):
        return True
    return isinstance(part, str) and part.isidentifier() and part not in _UNION_TAGS


def validation_message(errors: list[dict[str, Any]]) -> Rejected:
    """One line for pydantic's errors. A union field fails once per member: name the deepest
    location and say why, preferring a failed check (a lone surrogate, a bound) over
    "should be a valid list" from the members the value was never meant for."""
    if not errors:
        return Rejected("invalid request body")
    paths = [[str(p) for p in e.get("loc", ()) if _is_field(p)] for e in errors]
    field = paths[0][:1]
    same = [i for i, p in enumerate(paths) if p[:1] == field]
    depth = max(len(paths[i]) for i in same)
    deepest = [i for i in same if len(paths[i]) == depth]
    checks = [i for i in deepest if not str(errors[i].get("type", "")).endswith("_type")]
    chosen = checks or deepest
    param = ".".join(paths[chosen[0]]) or None
    reasons = list(dict.fromkeys(errors[i].get("msg", "invalid value") for i in chosen))
    message = f"{param or 'body'}: {' or '.join(reasons)}"
    if len(same) < len(errors):
        message += f" (and {len(errors) - len(same)} more errors)"
    return Rejected(message, param)


def validate_body(model: type[M], raw: bytes, max_prompt_ids: int | None = None) -> M | Rejected:
    """JSON bytes -> `model`, or why not. Runs in the worker process for big bodies."""
    if not raw:
        return Rejected(NOT_AN_OBJECT)
    try:
        data = json.loads(raw)
    except RecursionError:
        return Rejected("invalid JSON: nested too deeply")
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8/16/32
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8 text"
        return Rejected(f"invalid JSON: {reason}")
    if not isinstance(data, dict):
        return Rejected(NOT_AN_OBJECT)
    try:
        body = model.model_validate(data)
    except ValidationError as exc:
        return validation_message(exc.errors(include_url=False, include_input=False))
    except RecursionError:
        return Rejected("invalid JSON: nested too deeply")
    prompt = getattr(body, "prompt", None)
    if max_prompt_ids is not None and isinstance(prompt, list) and len(prompt) >= max_prompt_ids:
        return Rejected(  # the same words as the route's own check, before the list travels
            f"prompt has {len(prompt)} tokens; the model's context is {max_prompt_ids}",
            "prompt",
            "context_length_exceeded",
        )
    return body


class BodyParser:
    """Parses request bodies for the routes; `close()` stops the worker process."""

    def __init__(self, max_model_len: int | None = None, offload_bytes: int = OFFLOAD_BYTES):
        self.max_model_len = max_model_len
        self.offload_bytes = offload_bytes
        self.offloaded = 0  # bodies parsed in the worker process
        self.closed = False
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    async def parse(self, raw: bytes, content_type: str | None, model: type[M]) -> M:
        if not is_json(content_type):
            raise bad_request(NOT_AN_OBJECT)
        if len(raw) < self.offload_bytes:
            result = validate_body(model, raw, self.max_model_len)
        else:
            loop = asyncio.get_running_loop()
            try:
                result = await loop.run_in_executor(
                    self._worker(), validate_body, model, raw, self.max_model_len
                )
                self.offloaded += 1
            except concurrent.futures.BrokenExecutor:
                self._pool = None  # the worker died (OOM-killed?): a new one next time
                result = validate_body(model, raw, self.max_model_len)
        if isinstance(result, Rejected):
            raise result.error()
        return result

    def _worker(self) -> concurrent.futures.ProcessPoolExecutor:
        assert not self.closed, "body parser used after close()"
        if self._pool is None:
            # spawn, not fork: the server process has an engine thread and a torch runtime.
            # The worker dies with the server, even on kill -9 (reference_engine/server/lifeline.py).
            self._pool = concurrent.futures.ProcessPoolExecutor(
                1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=die_with_parent,
                initargs=(os.getpid(),),
            )
        return self._pool

    def close(self) -> None:
        self.closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
