"""Embeddings (`/v1/embeddings`, OpenAI's shape, as vLLM's pooling runner serves it).

The request: `input` (a string, a list of strings, a list of token ids, or a list of such
lists; at most `MAX_INPUTS`), `model`, `encoding_format` (`float`, or `base64`: little-endian
float32, the `openai` client's default), `dimensions` (only the model's own). Each input is
one engine request (`SamplingParams.embed`, one token): they are scheduled like any other
request, so continuous batching packs them with generation; the vector is the last prompt
token's final hidden state, L2-normalized (LAST pooling, `execution/pooling.py`). The body:
`data` (one `embedding` per input, in input order) and `usage.prompt_tokens`.
"""

from __future__ import annotations

import base64
import struct
from typing import Annotated, Any, Literal

from cbbench.reference_engine.server import protocol as P
from pydantic import Field

MAX_INPUTS = 2048  # as OpenAI's API

Ids = list[Annotated[int, Field(ge=0)]]


class EmbeddingsRequest(P._Strict):
    input: (
        P.Text
        | Annotated[list[P.Text], Field(min_length=1, max_length=MAX_INPUTS)]
        | Annotated[Ids, Field(min_length=1)]
        | Annotated[list[Ids], Field(min_length=1, max_length=MAX_INPUTS)]
    )
    model: P.Text | None = Field(None, max_length=1024)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    priority: int = Field(0, ge=-P.INT32, le=P.INT32)
    user: P.Text | None = None

    def inputs(self) -> list[str | list[int]]:
        """One entry per input: text to tokenize, or token ids."""
        x = self.input
        if isinstance(x, str) or (x and isinstance(x[0], int)):
            return [x]  # type: ignore[list-item]
        return list(x)  # type: ignore[arg-type]


def encode(vec: list[float], fmt: str) -> list[float] | str:
    if fmt == "float":
        return vec
    return base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode("ascii")


def body(vectors: list[list[float]], model: str, prompt_tokens: int, fmt: str) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": encode(v, fmt)}
            for i, v in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
