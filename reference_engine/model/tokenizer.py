"""Text <-> token ids for the server, and incremental detokenization for streams.

Two tokenizers share one small interface:
- `HFTokenizer`: the model folder's `tokenizer.json`, through the `tokenizers` library.
- `ByteTokenizer`: for models without one (presets, random weights). Token id = UTF-8 byte
  value + `BYTE_OFFSET` (3); ids 0, 1, 2 are PAD, BOS and EOS unless the model config names
  other BOS/EOS ids. Ids outside the byte range (the rest of the vocabulary) decode to no
  text. Encoding adds no BOS, so a prompt of N bytes is exactly N tokens.

`IncrementalDetokenizer` turns a growing list of ids into text deltas; it never emits a
partial UTF-8 character (held back until complete; invalid bytes become U+FFFD).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.model.chat_template import ChatTemplate, load_chat_template
from cbbench.reference_engine.model.config import ModelConfig

BYTE_OFFSET = 3
PAD_ID, DEFAULT_BOS_ID, DEFAULT_EOS_ID = 0, 1, 2

# The built-in chat template (for models without their own): one line naming the role, the content, a newline; ends with the
# assistant header so the model continues as the assistant.
CHAT_ROLE_PREFIX = "<|{role}|>\n"
CHAT_TURN_SUFFIX = "\n"


class Tokenizer(Protocol):
    eos_token_ids: tuple[int, ...]
    chat_template: ChatTemplate | None  # the model's own; None = the built-in one

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...

    def token_text(self, token_id: int) -> str:
        """One token as a string for logprobs: its text, or a visible name when it has none
        of its own (a special token, a byte of a multi-byte character)."""
        ...

    def new_detokenizer(self) -> IncrementalDetokenizer: ...


def apply_chat_template(messages: list[tuple[str, str]]) -> str:
    """The built-in template (models without one): [(role, content), ...] -> prompt text,
    ending with the assistant's turn header."""
    parts = [
        CHAT_ROLE_PREFIX.format(role=role) + content + CHAT_TURN_SUFFIX
        for role, content in messages
    ]
    return "".join(parts) + CHAT_ROLE_PREFIX.format(role="assistant")


def encode_chat(tok: Tokenizer, messages: list[tuple[str, str]]) -> list[int]:
    """Chat messages -> prompt ids: the model's template (its text carries the special tokens,
    so none are added, as transformers does), else the built-in one."""
    if tok.chat_template is None:
        return tok.encode(apply_chat_template(messages))
    rendered = tok.chat_template.render([{"role": r, "content": c} for r, c in messages])
    return tok.encode(rendered, add_special_tokens=False)


class IncrementalDetokenizer(Protocol):
    def push(self, token_ids: list[int]) -> str:
        """Add new ids; return the text they complete (may be empty)."""
        ...

    def flush(self) -> str:
        """End of stream: return any held-back text (incomplete bytes become U+FFFD)."""
        ...


class ByteTokenizer:
    def __init__(self, vocab_size: int, bos_token_id: int | None, eos_token_ids: tuple[int, ...]):
        if vocab_size < BYTE_OFFSET + 256:
            raise EngineError(
                f"byte-level tokenizer needs vocab_size >= {BYTE_OFFSET + 256}, got {vocab_size}"
            )
        self.vocab_size = vocab_size
        self.chat_template: ChatTemplate | None = None
        self.bos_token_id = DEFAULT_BOS_ID if bos_token_id is None else bos_token_id
        self.eos_token_ids = eos_token_ids or (DEFAULT_EOS_ID,)
        for tid in (self.bos_token_id, *self.eos_token_ids):
            if BYTE_OFFSET <= tid < BYTE_OFFSET + 256:
                raise EngineError(
                    f"byte-level tokenizer: special token id {tid} collides with the byte "
                    f"range [{BYTE_OFFSET}, {BYTE_OFFSET + 256})"
                )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [b + BYTE_OFFSET for b in text.encode("utf-8")]  # adds no special token

    def to_bytes(self, token_ids: list[int]) -> bytes:
        return bytes(t - BYTE_OFFSET for t in token_ids if BYTE_OFFSET <= t < BYTE_OFFSET + 256)

    def decode(self, token_ids: list[int]) -> str:
        return self.to_bytes(token_ids).decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str:
        b = token_id - BYTE_OFFSET
        if not 0 <= b < 256:
            return f"<|{token_id}|>"  # a special or unused id: no text of its own
        return chr(b) if b < 0x80 else f"<0x{b:02X}>"  # part of a multi-byte character

    def new_detokenizer(self) -> IncrementalDetokenizer:
        return _ByteDetokenizer(self)


class _ByteDetokenizer:
    def __init__(self, tok: ByteTokenizer):
        self._tok = tok
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_ids: list[int]) -> str:
        return self._utf8.decode(self._tok.to_bytes(token_ids))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


class HFTokenizer:
    def __init__(self, path: Path, eos_token_ids: tuple[int, ...]):
        from tokenizers import Tokenizer as _HF

        try:
            self._tok = _HF.from_file(str(path))
        except Exception as exc:  # the library raises a bare Exception on bad files
            raise EngineError(f"{path}: cannot load tokenizer ({str(exc)[:200]})") from None
        self.vocab_size = self._tok.get_vocab_size()
        self.eos_token_ids = eos_token_ids
        self.chat_template: ChatTemplate | None = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int]) -> str:
        return self._tok.decode(token_ids, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        text = self._tok.decode([token_id], skip_special_tokens=False)
        if text and "\ufffd" not in text:
            return text
        return self._tok.id_to_token(token_id) or f"<|{token_id}|>"

    def new_detokenizer(self) -> IncrementalDetokenizer:
        return _HFDetokenizer(self)


@dataclass
class _HFDetokenizer:
    """Decodes a sliding window of ids: text is emitted once the window's decoding no longer
    ends in U+FFFD (an incomplete multi-byte character split across tokens). A few ids of
    left context keep word-boundary spaces right for tokenizers that strip them."""

    tok: HFTokenizer
    ids: list[int] = field(default_factory=list)
    prefix_offset: int = 0  # start of the context window
    read_offset: int = 0  # ids before this are already emitted as text

    CONTEXT = 5

    def push(self, token_ids: list[int]) -> str:
        self.ids.extend(token_ids)
        prefix = self.tok.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.tok.decode(self.ids[self.prefix_offset :])
        if full.endswith("\ufffd") or len(full) <= len(prefix):
            return ""
        delta = full[len(prefix) :]
        self.read_offset = len(self.ids)
        self.prefix_offset = max(0, self.read_offset - self.CONTEXT)
        return delta

    def flush(self) -> str:
        if not self.ids or self.read_offset == len(self.ids):
            return ""
        prefix = self.tok.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.tok.decode(self.ids[self.prefix_offset :])
        self.read_offset = len(self.ids)
        return full[len(prefix) :] if full.startswith(prefix) else full


def load_tokenizer(model: str, model_config: ModelConfig) -> Tokenizer:
    """`model` is a preset name or a model folder; a folder with `tokenizer.json` gets the HF
    tokenizer, everything else the byte-level one. Either gets the folder's chat template."""
    path = Path(model) / "tokenizer.json"
    tok: HFTokenizer | ByteTokenizer
    if path.is_file():
        tok = HFTokenizer(path, model_config.eos_token_ids)
    else:
        tok = ByteTokenizer(
            model_config.vocab_size, model_config.bos_token_id, model_config.eos_token_ids
        )
    tok.chat_template = load_chat_template(model)
    return tok
