"""Mooncake JSONL traces: one request per line, read line by line.

`{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [...]}`; `hash_ids` name the
prompt's 512-token blocks (equal ids = a shareable prefix block) and become `prefix_ids`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from cbbench.workloads.errors import WorkloadError
from cbbench.workloads.tracefile import (
    TraceRow,
    display_name,
    open_text,
    parse_length,
    parse_seconds,
    replayable,
)

MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
MOONCAKE_BLOCK_SIZE = 512


def json_lines(path: str | Path) -> Iterator[tuple[str, object]]:
    """("file:line", parsed JSON) for each non-blank line."""
    name = display_name(path)
    with open_text(path) as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{name}:{line_no}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{where}: not valid JSON: {exc.msg}") from None


def parse_ids(value: object, key: str, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise WorkloadError(f"{where}: {key} must be a list of integers, got {value!r}")
    return tuple(value)


def read_mooncake(path: str | Path, skipped: Counter) -> Iterator[TraceRow]:
    for where, obj in json_lines(path):
        if not isinstance(obj, dict):
            raise WorkloadError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        for key in MOONCAKE_KEYS:
            if key not in obj:
                raise WorkloadError(f"{where}: missing column '{key}'")
        row = TraceRow(
            arrival_s=parse_seconds(obj["timestamp"], "timestamp", where, scale=1e-3),
            prompt_len=parse_length(obj["input_length"], "input_length", where),
            output_len=parse_length(obj["output_length"], "output_length", where),
            prefix_ids=parse_ids(obj.get("hash_ids", []), "hash_ids", where),
        )
        if replayable(row, skipped):  # 0 output or input tokens: skipped, counted
            yield row
