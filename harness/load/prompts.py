"""Prompts of exact token length, deterministic from the seed.

Token-id prompts (completions endpoint of vLLM and the reference engine) come from
workloads/tokens.py, the one request -> ids function that offline and simulated replays use
too: shared-prefix blocks, then request-specific ids, deterministic from the seed.

Text prompts (chat, or servers that only take text): with a `tokenizers` tokenizer.json, ids
are drawn from single-token words that survive a decode/encode round trip and the text is
checked to encode to exactly the asked length. Without one, the text is common one-token
English words separated by spaces: about one token per word on BPE tokenizers (GPT, Llama,
Qwen), an approximation that the client reconciles with the server's usage numbers; unless
the server exposes its tokenizer (`/tokenize`): then text of the exact length is written with
what each word costs there (harness/load/text_fit.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from cbbench.harness.client.endpoints import is_conversational
from cbbench.harness.errors import CbbenchError
from cbbench.harness.load.chat_template import load_chat_renderer
from cbbench.harness.load.text_fit import TextFit
from cbbench.harness.load.words import WORDS
from cbbench.workloads.tokens import DEFAULT_ID_RANGE, PromptTokenIds


class PromptBuilder:
    def __init__(
        self,
        seed: int = 0,
        prefix_block_size: int = 512,
        tokenizer_path: str | None = None,
        id_range: tuple[int, int] = DEFAULT_ID_RANGE,
        text_fit: TextFit | None = None,
    ) -> None:
        assert prefix_block_size > 0 and id_range[1] > id_range[0]
        self.seed = seed
        self.prefix_block_size = prefix_block_size
        self.tokenizer = None
        self.chat_render = None  # the model's chat template, from the tokenizer's folder
        self.text_fit = None if tokenizer_path else text_fit  # the server's, via /tokenize
        vocab = np.arange(*id_range, dtype=np.int64)
        if tokenizer_path:
            self.tokenizer = _load_tokenizer(tokenizer_path)
            vocab = _single_token_words(self.tokenizer, tokenizer_path)
            folder = Path(tokenizer_path)
            self.chat_render = load_chat_renderer(folder if folder.is_dir() else folder.parent)
        self._ids = PromptTokenIds(seed, prefix_block_size, vocab)
        self._ready: dict[tuple[int, int, tuple[int, ...]], list[int]] = {}  # prefetched

    def prefetch(self, requests: Sequence[tuple[int, int, tuple[int, ...]]]) -> None:
        """Build these (index, prompt_len, prefix_ids) requests' ids in one batch (~1 us a
        request instead of ~8); `token_ids` hands each out once."""
        for key, ids in zip(requests, self._ids.many(requests), strict=True):
            self._ready[key] = ids

    def token_ids(self, index: int, prompt_len: int, prefix_ids: tuple[int, ...] = ()) -> list[int]:
        """Exactly `prompt_len` ids: prefix blocks (truncated to fit), then request-own ids."""
        ids = self._ready.pop((index, prompt_len, prefix_ids), None)
        return ids if ids is not None else self._ids(index, prompt_len, prefix_ids)

    def text(self, index: int, prompt_len: int, prefix_ids: tuple[int, ...] = ()) -> str:
        ids = self.token_ids(index, prompt_len, prefix_ids)
        if self.text_fit is not None:  # exact on the server's tokenizer
            return self.text_fit.text(ids, prompt_len)
        if self.tokenizer is None:
            return " ".join(WORDS[i % len(WORDS)] for i in ids)
        text = self.tokenizer.decode(ids)
        n = len(self.tokenizer.encode(text, add_special_tokens=False).ids)
        if n != prompt_len:  # words were picked to round-trip; say so if one did not
            raise CbbenchError(
                f"tokenizer: a {prompt_len}-token prompt re-encodes to {n} tokens; "
                "this tokenizer does not round-trip its single-token words"
            )
        return text

    def count(self, text: str) -> int | None:
        """Tokens in `text` per the local tokenizer; None without one."""
        if self.tokenizer is None:
            return None
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def count_chat(self, messages: list[dict]) -> int | None:
        """Prompt tokens of a chat request as the server builds them: the model's chat
        template (with the generation prompt), then the tokenizer; None without a template."""
        if self.tokenizer is None or self.chat_render is None:
            return None
        text = self.chat_render(messages)
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def count_prompt(
        self, prompt: list | str, endpoint: str, prompt_len: int, session: bool
    ) -> int | None:
        """A request's prompt tokens as the client reckons them (None: unknown). `prompt_len`
        is what a lone request asked for; a session's prompt holds its history too."""
        if is_conversational(endpoint):  # with the model's template, as the server
            if isinstance(prompt, dict):  # an agent step (load/agent.py)
                prompt = prompt["messages"]
            msgs = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
            n = self.count_chat(msgs)
            fit = self.text_fit
            if n is None and not session and fit is not None and fit.chat_overhead is not None:
                n = prompt_len + fit.chat_overhead  # the server's template, measured
            elif n is None and not session:
                n = prompt_len  # the message alone; the server's template adds to it
            return n
        if isinstance(prompt, str):  # text of the asked length, or a session's history
            return prompt_len if not session else self.count(prompt)
        return len(prompt)


def _load_tokenizer(path: str):
    from tokenizers import Tokenizer

    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise CbbenchError(f"--tokenizer {path}: no tokenizer.json there")
    try:
        return Tokenizer.from_file(str(p))
    except Exception as exc:  # tokenizers raises a bare Exception on a bad file
        raise CbbenchError(f"--tokenizer {p}: cannot load ({exc})") from None


def _single_token_words(tok, path: str) -> np.ndarray:
    """Ids of plain ASCII words whose repetition decodes and re-encodes to the same ids."""
    vocab = tok.get_vocab()
    candidates = []
    for _, i in sorted(vocab.items(), key=lambda kv: kv[1]):
        word = tok.decode([i]).strip()
        if len(word) > 1 and word.isalpha() and word.isascii():
            candidates.append(i)
        if len(candidates) >= 4000:
            break
    ok = []
    for i in candidates:
        enc = tok.encode(tok.decode([i, i, i]), add_special_tokens=False).ids
        if enc == [i, i, i]:
            ok.append(i)
    if len(ok) < 50:
        raise CbbenchError(f"--tokenizer {path}: found only {len(ok)} round-tripping word tokens")
    return np.asarray(ok, dtype=np.int64)
