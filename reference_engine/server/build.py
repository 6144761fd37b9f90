"""Assemble a serving stack from an EngineConfig: engine, tokenizer, metrics, engine thread
and HTTP app. Used by `cbbench serve` and by tests that serve in-process."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cbbench.reference_engine.config import EngineConfig
from cbbench.reference_engine.server.app import DEFAULT_MAX_BODY_BYTES, create_app
from cbbench.reference_engine.server.async_engine import AsyncEngine
from cbbench.reference_engine.server.metrics import ServerMetrics
from cbbench.reference_engine.tokenizer import Tokenizer, load_tokenizer
from starlette.types import ASGIApp


@dataclass
class ServingStack:
    app: ASGIApp
    engine: AsyncEngine
    tokenizer: Tokenizer
    metrics: ServerMetrics
    model_name: str
    engine_info: dict

    def shutdown(self, reason: str = "server shutting down", wait: bool = True) -> None:
        self.engine.shutdown(reason, wait)

    def stop_soon(self) -> None:
        """For signal handlers: start the shutdown without waiting for the engine thread."""
        self.engine.shutdown(wait=False)


def build_stack(
    config: EngineConfig,
    *,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    llm_engine: Any = None,
) -> ServingStack:
    """Builds (or takes) the LLMEngine and starts its thread; `shutdown()` stops it."""
    if llm_engine is None:
        from cbbench.reference_engine.engine import LLMEngine

        llm_engine = LLMEngine.from_config(config)
    model_config = llm_engine.model_config
    model_name = served_model_name or config.model
    max_model_len = llm_engine.max_model_len
    tokenizer = load_tokenizer(config.model, model_config)
    metrics = ServerMetrics(model_name, config.scheduler)
    engine = AsyncEngine(llm_engine, metrics)
    app = create_app(
        engine,
        tokenizer,
        model_name=model_name,
        scheduler=config.scheduler,
        max_model_len=max_model_len,
        vocab_size=model_config.vocab_size,
        metrics=metrics,
        api_key=api_key,
        max_body_bytes=max_body_bytes,
        engine_info=llm_engine.describe(),
    )
    engine.start()
    return ServingStack(app, engine, tokenizer, metrics, model_name, llm_engine.describe())
