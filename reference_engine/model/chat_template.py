"""The model's own chat template, rendered as transformers does.

A model folder names its template in `chat_template.jinja`, or as `chat_template` in
`tokenizer_config.json` (a string, or a list of named templates: "default" is used). Rendering
follows transformers' `apply_chat_template`: a sandboxed Jinja2 environment (templates come
with downloaded models and must not reach Python internals) with `trim_blocks` and
`lstrip_blocks`, the `loopcontrols` extension, a `tojson` filter and `raise_exception`;
variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token` and the other special
tokens of `tokenizer_config.json`. The rendered text is tokenized without adding special
tokens: the template writes them itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from cbbench.reference_engine.errors import EngineError

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")


def _token_text(value: object) -> str | None:
    if isinstance(value, dict):  # {"content": "<s>", "lstrip": false, ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class ChatTemplate:
    source: str
    special_tokens: dict[str, str]
    origin: str  # the file it came from, for messages

    def __post_init__(self) -> None:
        object.__setattr__(self, "_compiled", _compile(self.source, self.origin))

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        from jinja2.exceptions import TemplateError

        try:
            return self._compiled.render(  # type: ignore[attr-defined]
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )
        except TemplateError as exc:
            raise EngineError(f"{self.origin}: chat template: {exc}") from None


def _compile(source: str, origin: str):
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(source)
    except TemplateError as exc:
        raise EngineError(f"{origin}: bad chat template: {exc}") from None


def load_chat_template(folder: str | Path) -> ChatTemplate | None:
    """The folder's chat template, or None when it has none (or is not a folder)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    config: dict = {}
    cfg_path = folder / CONFIG_FILE
    if cfg_path.is_file():
        try:
            config = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise EngineError(f"{cfg_path}: cannot read ({exc})") from None
        if not isinstance(config, dict):
            raise EngineError(f"{cfg_path}: expected a JSON object")
    specials = {k: t for k in SPECIAL_KEYS if (t := _token_text(config.get(k))) is not None}
    jinja = folder / TEMPLATE_FILE
    if jinja.is_file():
        return ChatTemplate(jinja.read_text(encoding="utf-8"), specials, str(jinja))
    source = config.get("chat_template")
    if isinstance(source, list):  # named templates: [{"name": "default", "template": ...}]
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if source is None:
        return None
    if not isinstance(source, str):
        raise EngineError(f"{cfg_path}: chat_template must be a string")
    return ChatTemplate(source, specials, str(cfg_path))
