"""What the client captured of one response: its text, and the token ids when the server
returned them. Multi-turn sessions (`load/sessions.py`) build the next turn's history from it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Reply:
    """What the client captured of one response, for the next turn's history."""

    text: list[str] = field(default_factory=list)  # pieces, in order
    token_ids: list[int] | None = None  # generated ids, when the server returned them
    prompt_token_ids: list[int] | None = None  # the prompt as the server tokenized it

    @property
    def full_text(self) -> str:
        return "".join(self.text)

    def add_choice(self, choice: dict) -> None:
        """Fold one response choice (a stream chunk's or a whole body's) into the reply."""
        text = choice.get("text")
        if text is None:
            msg = choice.get("delta") or choice.get("message") or {}
            text = msg.get("content")
        if text:
            self.text.append(text)
        ids = choice.get("token_ids")
        if ids is not None:
            self.token_ids = (self.token_ids or []) + list(ids)
        prompt_ids = choice.get("prompt_token_ids")
        if prompt_ids is not None:
            self.prompt_token_ids = list(prompt_ids)
