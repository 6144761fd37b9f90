"""Assemble a serving stack from an EngineConfig: engine, tokenizer, metrics, engine driver
and HTTP app. Used by `cbbench serve` and by tests that serve in-process.

Two ways to drive the engine, same HTTP app on top:
- `engine_process=True` (the default of `cbbench serve`): the engine runs in its own process
  (engine_core.py), the API process only does HTTP, tokenization and detokenization.
- `engine_process=False` (tests, the simulator, `--no-engine-process`): the engine runs in a
  thread of this process (async_engine.py), sharing the GIL with the HTTP server.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.model.tokenizer import Tokenizer, load_tokenizer
from cbbench.reference_engine.server.app import DEFAULT_MAX_BODY_BYTES, create_app
from cbbench.reference_engine.server.async_engine import AsyncEngine
from cbbench.reference_engine.server.body import BodyParser
from cbbench.reference_engine.server.metrics import ServerMetrics
from cbbench.reference_engine.server.reasoning import ReasoningOptions
from starlette.types import ASGIApp


@dataclass
class ServingStack:
    app: ASGIApp
    engine: Any  # AsyncEngine (thread) or EngineCoreClient (process): the same interface
    tokenizer: Tokenizer
    metrics: ServerMetrics
    model_name: str
    engine_info: dict
    body_parser: BodyParser

    def shutdown(self, reason: str = "server shutting down", wait: bool = True) -> None:
        self.engine.shutdown(reason, wait)
        self.body_parser.close()

    def stop_soon(self) -> None:
        """For signal handlers: start the shutdown without waiting for the engine."""
        self.engine.shutdown(wait=False)


def _version() -> str | None:
    """cbbench's installed version: a run's report names the server's (`server: cbbench X`)."""
    from importlib import metadata

    try:
        return metadata.version("cbbench")
    except metadata.PackageNotFoundError:
        return None


def build_stack(
    config: EngineConfig,
    *,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    llm_engine: Any = None,
    engine_process: bool = False,
    engine_nice: int = 0,
    reasoning: ReasoningOptions | None = None,
) -> ServingStack:
    """Builds (or takes) the engine and starts its driver; `shutdown()` stops it."""
    model_name = served_model_name or config.model
    metrics = ServerMetrics(model_name, config.scheduler)
    engine: Any
    if engine_process:
        from cbbench.reference_engine.model.config import resolve_model_config
        from cbbench.reference_engine.server.core_client import EngineCoreClient

        assert llm_engine is None, "an engine process builds its own engine"
        model_config = resolve_model_config(config.model)  # for the tokenizer; fails fast
        engine = EngineCoreClient(config, metrics, nice=engine_nice)
        engine.start()
        info, max_model_len, vocab_size = engine.info, engine.max_model_len, engine.vocab_size
    else:
        if llm_engine is None:
            from cbbench.reference_engine.engine.llm_engine import LLMEngine

            llm_engine = LLMEngine.from_config(config)
        model_config = llm_engine.model_config
        info, max_model_len = llm_engine.describe(), llm_engine.max_model_len
        vocab_size = model_config.vocab_size
        engine = AsyncEngine(llm_engine, metrics)
    info = {**info, "engine_process": engine_process, "version": _version()}
    info["config"] = json.loads(json.dumps(dataclasses.asdict(config), default=str))  # whole
    metrics.set_cache_config(info)
    body_parser = BodyParser(max_model_len)
    try:
        tokenizer = load_tokenizer(config.model, model_config)
        template = tokenizer.chat_template
        info["chat_template"] = template.origin if template is not None else "built-in"
        app = create_app(
            engine,
            tokenizer,
            model_name=model_name,
            scheduler=config.scheduler,
            max_model_len=max_model_len,
            vocab_size=vocab_size,
            metrics=metrics,
            api_key=api_key,
            max_body_bytes=max_body_bytes,
            engine_info=info,
            body_parser=body_parser,
            reasoning=reasoning,
        )
    except BaseException:
        if engine_process:
            engine.shutdown()
        raise
    if not engine_process:
        engine.start()
    return ServingStack(app, engine, tokenizer, metrics, model_name, info, body_parser)
