"""Speculative decoding's settings (continuous scheduler only), each field with its flag."""

from __future__ import annotations

from dataclasses import dataclass, field

from cbbench.reference_engine.config.flags import flag
from cbbench.reference_engine.errors import EngineError

SPECULATIVE_METHODS = ("ngram", "draft")


@dataclass
class SpeculativeConfig:
    """Speculative decoding (continuous scheduler only): each decode step verifies up to
    `num_speculative_tokens` proposed tokens per sequence in the one target forward."""

    # None (off) | "ngram" (prompt lookup) | "draft" (a draft model)
    method: str | None = field(
        default=None,
        metadata=flag(
            "--speculative-method",
            "propose draft tokens by n-gram prompt lookup or with a draft model (default: off)",
            choices=SPECULATIVE_METHODS,
        ),
    )
    num_speculative_tokens: int = field(
        default=4, metadata=flag("--num-speculative-tokens", "drafts per step")
    )
    # method "draft": a preset or HF folder with the target's vocab
    model: str | None = field(
        default=None,
        metadata=flag(
            "--speculative-model",
            "draft model for --speculative-method draft: a preset or HF folder with the "
            "target's vocabulary (the target itself is a 100%% acceptance control)",
        ),
    )
    # method "ngram": shortest / longest suffix looked up in the context
    ngram_min: int = field(default=1, metadata=flag("--ngram-min", "shortest suffix looked up"))
    ngram_max: int = field(default=3, metadata=flag("--ngram-max", "longest suffix looked up"))
    # simulator only: probability that each draft token is accepted (the proposer is modelled)
    acceptance_rate: float = field(
        default=0.7,
        metadata=flag(
            "--spec-acceptance-rate",
            "simulator only: per-draft-token acceptance probability",
        ),
    )

    @property
    def enabled(self) -> bool:
        return self.method is not None

    def validate(self) -> None:
        if self.method is None:
            return
        if self.method not in SPECULATIVE_METHODS:
            raise EngineError(
                f"speculative.method must be one of {', '.join(SPECULATIVE_METHODS)}, "
                f"got {self.method!r}"
            )
        if self.num_speculative_tokens < 1:
            raise EngineError(
                f"speculative.num_speculative_tokens must be >= 1, "
                f"got {self.num_speculative_tokens}"
            )
        if self.method == "draft" and not self.model:
            raise EngineError(
                "speculative method 'draft' needs a draft model (--speculative-model)"
            )
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise EngineError(
                f"speculative ngram sizes must satisfy 1 <= ngram_min <= ngram_max, got "
                f"{self.ngram_min}, {self.ngram_max}"
            )
        if not 0 <= self.acceptance_rate <= 1:
            raise EngineError(
                f"speculative.acceptance_rate must be in [0, 1], got {self.acceptance_rate}"
            )
