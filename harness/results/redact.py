"""Secrets never reach a run folder: API keys, `Authorization`-like headers and URL passwords
are replaced by `***` in everything cbbench stores (run.json, requests.jsonl) or prints
about a run. Run folders get uploaded as CI artifacts; the key must not go with them.

- `redact_argv`: a command line (`--api-key KEY`, `--api-key=KEY`, `--header 'Authorization:
  Bearer KEY'`, `-H ...`, `http://user:pass@host`).
- `redact_meta`: a run.json-like document: `command`/`argv` lists, fields named like secrets
  (`api_key`, `authorization`, `token`, `password`...), URLs with a password.
- `redact_text`: any string, given the secret values in play (a server that echoes the key
  in an error message).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

MASK = "***"

# Flags whose value is a secret (with or without `=`).
SECRET_FLAGS = ("--api-key", "--token", "--hf-token", "--password", "--auth-token")
HEADER_FLAGS = ("--header", "-H")
SECRET_HEADERS = ("authorization", "proxy-authorization", "x-api-key", "api-key", "cookie")
_SECRET_KEY = re.compile(
    r"(^|_|-)(api_?key|authorization|password|secret|(hf|auth|access|bearer)_?token)$", re.I
)
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):[^@/\s]+@", re.I)


def _redact_header(value: str) -> str:
    name, sep, _ = value.partition(":")
    if sep and name.strip().lower() in SECRET_HEADERS:
        return f"{name}: {MASK}"
    return value


def _redact_url(text: str) -> str:
    return _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)


def redact_argv(argv: Iterable[str]) -> list[str]:
    out: list[str] = []
    pending: str | None = None  # the flag whose value comes next
    for arg in argv:
        arg = str(arg)
        if pending is not None:
            out.append(MASK if pending in SECRET_FLAGS else _redact_header(arg))
            pending = None
            continue
        flag, eq, value = arg.partition("=")
        if flag in SECRET_FLAGS:
            if eq:
                out.append(f"{flag}={MASK}")
            else:
                out.append(arg)
                pending = flag
            continue
        if flag in HEADER_FLAGS:
            if eq:
                out.append(f"{flag}={_redact_header(value)}")
            else:
                out.append(arg)
                pending = flag
            continue
        if arg.startswith("-H") and len(arg) > 2:  # -H'Authorization: ...'
            out.append("-H" + _redact_header(arg[2:]))
            continue
        out.append(_redact_url(arg))
    return out


def redact_meta(doc: Any) -> Any:
    """A copy of `doc` (dicts, lists, scalars) with secrets masked."""
    if isinstance(doc, dict):
        out: dict[Any, Any] = {}
        for key, value in doc.items():
            if key in ("command", "argv") and isinstance(value, list | tuple):
                out[key] = redact_argv(value)
            elif isinstance(key, str) and _SECRET_KEY.search(key) and isinstance(value, str):
                out[key] = MASK if value else value
            elif isinstance(key, str) and key.lower() in SECRET_HEADERS and value:
                out[key] = MASK
            else:
                out[key] = redact_meta(value)
        return out
    if isinstance(doc, list | tuple):
        return [redact_meta(v) for v in doc]
    if isinstance(doc, str):
        return _redact_url(doc)
    return doc


def redact_text(text: str, secrets: Iterable[str | None]) -> str:
    for secret in secrets:
        if secret and len(secret) >= 3 and secret in text:  # a 1-character key would mask noise
            text = text.replace(secret, MASK)
    return _redact_url(text)
