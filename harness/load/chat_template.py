"""Client-side chat prompt counting: the model's own chat template, rendered as transformers
does, so that `--tokenizer` counts the tokens the server will see on /v1/chat/completions.

The template comes from the tokenizer's folder: `chat_template.jinja`, else `chat_template` in
`tokenizer_config.json` (a list of named templates: "default"). Rendering: a sandboxed Jinja2
environment with `trim_blocks`/`lstrip_blocks`, `loopcontrols`, `tojson`, `raise_exception`,
the special tokens of tokenizer_config.json and `add_generation_prompt=True`; the text is then
encoded without adding special tokens. (The reference engine renders with its own copy of
these rules; the harness library talks to engines over HTTP only, so it imports none of it.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from cbbench.harness.errors import CbbenchError

SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")
Render = Callable[[list[dict]], str]


def _special(value: object) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def load_chat_renderer(folder: Path) -> Render | None:
    """messages -> prompt text with the folder's chat template; None without one."""
    config: dict = {}
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        try:
            config = json.loads(cfg.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CbbenchError(f"{cfg}: cannot read ({exc})") from None
    jinja = folder / "chat_template.jinja"
    source = jinja.read_text(encoding="utf-8") if jinja.is_file() else config.get("chat_template")
    if isinstance(source, list):
        source = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}.get(
            "default"
        )
    if not isinstance(source, str):
        return None
    specials = {k: t for k in SPECIAL_KEYS if (t := _special(config.get(k))) is not None}

    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    where = jinja if jinja.is_file() else cfg
    try:
        template = env.from_string(source)
    except TemplateError as exc:
        raise CbbenchError(f"{where}: bad chat template: {exc}") from None

    def render(messages: list[dict]) -> str:
        try:
            return template.render(messages=messages, add_generation_prompt=True, **specials)
        except TemplateError as exc:
            raise CbbenchError(f"{where}: chat template: {exc}") from None

    return render
