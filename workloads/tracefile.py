"""What every trace loader shares: opening (plain, .gz, packaged), field parsing, row assembly.

Loaders stream rows (one line at a time) and yield `TraceRow`s; `build_trace_workload` takes the
first N, makes arrival times relative (first request at 0.0) and numbers the requests.
"""

from __future__ import annotations

import gzip
import io
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import IO

from cbbench.workloads.errors import WorkloadError
from cbbench.workloads.spec import RequestSpec, Workload

GZIP_MAGIC = b"\x1f\x8b"
PACKAGED_PREFIX = "package:"  # "package:NAME" = workloads/data/NAME inside the installed package


@dataclass(frozen=True)
class TraceRow:
    arrival_s: float | None  # seconds on the trace's own clock (absolute is fine)
    prompt_len: int
    output_len: int
    prefix_ids: tuple[int, ...] = ()
    session_id: str | None = None
    turn: int | None = None
    priority: int = 0
    text: str | None = None  # the message's real text (ShareGPT sessions)


def display_name(path: str | Path) -> str:
    s = str(path)
    return s[len(PACKAGED_PREFIX) :] if s.startswith(PACKAGED_PREFIX) else s


@contextmanager
def open_text(path: str | Path) -> Iterator[IO[str]]:
    """A text stream over a trace file: plain or gzip (by magic bytes), or a packaged copy."""
    s = str(path)
    try:
        if s.startswith(PACKAGED_PREFIX):
            res = resources.files("cbbench.workloads").joinpath("data", s[len(PACKAGED_PREFIX) :])
            raw = res.open("rb")
        else:
            raw = open(s, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise WorkloadError(f"{display_name(s)}: cannot open: {exc.strerror or exc}") from None
    try:
        binary: IO[bytes] = raw if hasattr(raw, "peek") else io.BufferedReader(raw)
        if binary.peek(2)[:2] == GZIP_MAGIC:  # type: ignore[attr-defined]
            binary = gzip.GzipFile(fileobj=binary)
        with io.TextIOWrapper(binary, encoding="utf-8-sig", newline="") as text:
            yield text
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{display_name(s)}: cannot read: {exc}") from None
    finally:
        raw.close()


def parse_length(value: object, column: str, where: str) -> int:
    """A token count: a non-negative integer (an integral float such as 12.0 is accepted)."""
    if isinstance(value, bool):
        raise WorkloadError(f"{where}: {column} is not a number: {value!r}")
    if isinstance(value, int):
        n = value
    else:
        text = value.strip() if isinstance(value, str) else value
        try:
            n = int(text)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            try:
                f = float(text)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise WorkloadError(f"{where}: {column} is not a number: {value!r}") from None
            if not math.isfinite(f) or not f.is_integer():
                raise WorkloadError(f"{where}: {column} is not a whole number: {value!r}") from None
            n = int(f)
    if n < 0:
        raise WorkloadError(f"{where}: {column} is negative: {n}")
    return n


def replayable(row: TraceRow, skipped: Counter) -> bool:
    """False, and counted, for a row no server can replay: 0 output tokens (`max_tokens` 0 is
    refused with HTTP 400, an error the trace did not have) or an empty prompt."""
    if row.output_len == 0:
        skipped["zero_output"] += 1
        return False
    if row.prompt_len == 0:
        skipped["empty_prompt"] += 1
        return False
    return True


def parse_seconds(value: object, column: str, where: str, scale: float = 1.0) -> float:
    """A numeric timestamp, times `scale` to make seconds; finite and >= 0."""
    if isinstance(value, bool):
        raise WorkloadError(f"{where}: bad timestamp in {column}: {value!r}")
    try:
        t = float(value.strip() if isinstance(value, str) else value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise WorkloadError(f"{where}: bad timestamp in {column}: {value!r}") from None
    if not math.isfinite(t) or t < 0:
        raise WorkloadError(f"{where}: bad timestamp in {column}: {value!r}")
    return t * scale


def build_trace_workload(
    rows: Iterable[TraceRow],
    name: str,
    seed: int,
    num_requests: int | None,
    source: dict,
    skipped: Counter,
    prefix_block_size: int = 512,
) -> Workload:
    """The first `num_requests` rows as a workload, arrivals relative to the first request.

    Rows out of time order are stably sorted by time (the count goes in source["reordered"]).
    `skipped` is filled by the loader as it streams; it is read after the rows are consumed.
    """
    taken: list[TraceRow] = []
    if num_requests != 0:
        for row in rows:  # stops pulling rows (parsing) once N are taken
            taken.append(row)
            if num_requests is not None and len(taken) >= num_requests:
                break
    timed = [r.arrival_s is not None for r in taken]
    assert all(timed) or not any(timed), "a trace has times on every row or on none"
    reordered, t0 = 0, 0.0
    if taken and timed[0]:
        ordered = sorted(taken, key=lambda r: r.arrival_s)  # type: ignore[arg-type,return-value]
        reordered = sum(a is not b for a, b in zip(ordered, taken, strict=True))
        taken = ordered
        t0 = taken[0].arrival_s
    requests = tuple(
        RequestSpec(
            index=i,
            prompt_len=r.prompt_len,
            output_len=r.output_len,
            arrival_s=None if r.arrival_s is None else r.arrival_s - t0,
            priority=r.priority,
            prefix_ids=r.prefix_ids,
            session_id=r.session_id,
            turn=r.turn,
            text=r.text,
        )
        for i, r in enumerate(taken)
    )
    full_source = dict(source) | {"rows_skipped": dict(sorted(skipped.items()))}
    if reordered:
        full_source["reordered"] = reordered
    return Workload(
        name=name,
        seed=seed,
        requests=requests,
        prefix_block_size=prefix_block_size,
        source=full_source,
    )
