"""`cbbench serve --reasoning-parser NAME`: chat outputs streamed as a reasoning model's are,
thinking first, then the answer, as vLLM's reasoning parsers return them.

With random weights the split cannot come from the model's own `</think>`, so it is a rule:
the first `budget` tokens of each chat output are reasoning, budget = round(share x max
tokens), at most max tokens - 1 (one answer token is left when max tokens >= 2). `share` is
`--reasoning-share` (default 0.5) times the request's `reasoning_effort` (minimal 0.25, low
0.5, medium 1, high 1.5); `chat_template_kwargs: {"enable_thinking": false}` turns reasoning
off for the request, as Qwen3's template does. An output that ends early (EOS, a stop string)
may end inside its reasoning, as a real model's can.

Where it goes (`--reasoning-field`): `reasoning` (vLLM >= 0.11, the default),
`reasoning_content` (older vLLM, SGLang, DeepSeek's API), or `content`: inline between
`<think>` and `</think>` in the answer's own field, as a server without a reasoning parser
streams a thinking model (the tags are text, not extra tokens). A delta whose tokens cross
the boundary goes out as two chunks, each with its own token ids. usage carries
`completion_tokens_details.reasoning_tokens`. Completions (not chat) are never split.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

REASONING_PARSERS = ("deepseek_r1", "qwen3")  # vLLM's names; the same rule here
REASONING_FIELDS = ("reasoning", "reasoning_content", "content")
EFFORT_SCALE = {"minimal": 0.25, "low": 0.5, "medium": 1.0, "high": 1.5}
OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningOptions:
    parser: str | None = None  # None: no reasoning
    field: str = "reasoning"
    share: float = 0.5

    @staticmethod
    def add_args(p: argparse.ArgumentParser) -> None:
        g = p.add_argument_group("reasoning (docs/serving.md)")
        g.add_argument(
            "--reasoning-parser",
            choices=REASONING_PARSERS,
            default=None,
            help="stream the first part of each chat output as reasoning, as vLLM's parser "
            "of that name does (the split is a rule: --reasoning-share)",
        )
        g.add_argument(
            "--reasoning-field",
            choices=REASONING_FIELDS,
            default="reasoning",
            help="where reasoning goes: reasoning (vLLM >= 0.11, default), reasoning_content "
            "(older vLLM, SGLang), content (inline <think>...</think>)",
        )
        g.add_argument(
            "--reasoning-share",
            type=float,
            default=0.5,
            help="fraction of each output's max tokens that is reasoning (default 0.5; "
            "reasoning_effort scales it)",
        )

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> ReasoningOptions:
        from cbbench.reference_engine.errors import EngineError

        share = getattr(ns, "reasoning_share", 0.5)
        if not 0.0 <= share <= 1.0:
            raise EngineError(f"--reasoning-share must be in [0, 1], got {share}")
        return cls(
            getattr(ns, "reasoning_parser", None),
            getattr(ns, "reasoning_field", "reasoning"),
            share,
        )

    def argv(self) -> list[str]:
        """The flags that give these options (for replica children)."""
        if self.parser is None:
            return []
        return [
            "--reasoning-parser", self.parser,
            "--reasoning-field", self.field,
            "--reasoning-share", str(self.share),
        ]  # fmt: skip


def budget(opts: ReasoningOptions, max_tokens: int, effort: str | None, thinking: bool) -> int:
    """Reasoning tokens of one chat output of at most `max_tokens`."""
    if opts.parser is None or not thinking or max_tokens < 1:
        return 0
    share = min(1.0, opts.share * EFFORT_SCALE.get(effort or "medium", 1.0))
    return min(round(share * max_tokens), max_tokens - 1)


@dataclass
class ReasoningSplit:
    """One output's split: `parts` of each delta, and the text of each kind so far."""

    budget: int
    where: str = "reasoning"  # --reasoning-field
    n: int = 0  # output tokens so far
    reasoning_text: list[str] = field(default_factory=list)
    answer_text: list[str] = field(default_factory=list)

    @property
    def reasoning_tokens(self) -> int:
        return min(self.n, self.budget)

    @property
    def separate(self) -> bool:
        """Whether the reasoning has its own field (Responses' reasoning item, Messages'
        thinking block), not inline in the answer's text."""
        return self.budget > 0 and self.where != "content"

    def parts(self, text: str, k: int) -> list[tuple[str, str, int]]:
        """(field, text, tokens) of a delta of `k` tokens: its reasoning, then its answer."""
        start, self.n = self.n, self.n + k
        r = max(0, min(k, self.budget - start))
        if r == 0:
            self.answer_text.append(text)
            return [("content", text, k)]
        cut = len(text) if r == k else len(text) * r // max(k, 1)
        think = text[:cut]
        self.reasoning_text.append(think)
        if self.where == "content":
            think = (
                (OPEN if start == 0 else "") + think + (CLOSE if start + r == self.budget else "")
            )
        out = [(self.where, think, r)]
        if r < k:
            self.answer_text.append(text[cut:])
            out.append(("content", text[cut:], k - r))
        return out

    def message(self) -> dict[str, str | None]:
        """A non-streaming message's text fields."""
        think, answer = "".join(self.reasoning_text), "".join(self.answer_text)
        if not self.budget:
            return {"content": answer}
        if self.where == "content":
            closed = CLOSE if self.n >= self.budget else ""
            return {"content": OPEN + think + closed + answer}
        return {self.where: think, "content": answer}
