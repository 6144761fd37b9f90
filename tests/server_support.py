"""Helpers for the server tests: a real server on 127.0.0.1:0 in a uvicorn thread, and a
/metrics reader through prometheus-client's own parser."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import httpx
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.server.build import ServingStack, build_stack
from cbbench.reference_engine.server.runner import ThreadedServer
from prometheus_client.parser import text_string_to_metric_families


@contextlib.contextmanager
def serve(
    config: EngineConfig | None = None, **stack_kwargs: Any
) -> Iterator[tuple[str, ServingStack]]:
    stack = build_stack(config or EngineConfig(model="tiny"), **stack_kwargs)
    try:
        with ThreadedServer(stack.app, on_stop=stack.stop_soon) as url:
            yield url, stack
    finally:
        stack.shutdown()


def scrape(url: str) -> dict[str, float]:
    """Sample name (with sorted labels other than model_name) -> value."""
    text = httpx.get(url + "/metrics", timeout=10).text
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            samples[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return samples


def wait_for_metric(url: str, name: str, value: float, timeout_s: float = 10.0) -> float:
    """Poll /metrics until `name` equals `value` (bounded); returns the last value seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen = scrape(url).get(name)
        if seen == value or time.monotonic() > deadline:
            return seen if seen is not None else float("nan")
        time.sleep(0.02)
