"""CSV traces: Azure LLM inference 2023/2024 and BurstGPT, read row by row with the csv module.

Azure: `TIMESTAMP` (wall clock such as `2023-11-16 18:15:46.6805900`, 100 ns digits; an ISO `T`
and a `+00:00`/`Z` suffix are accepted), `ContextTokens`, `GeneratedTokens`.
BurstGPT: `Timestamp` (seconds), `Model`, `Request tokens`, `Response tokens`, `Total tokens`,
`Log Type`; failed requests (0 response tokens) are dropped by default and counted.
Azure rows with 0 generated (or 0 context) tokens are skipped and counted (`replayable`).
"""

from __future__ import annotations

import csv
import datetime as dt
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

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
BURSTGPT_OPTIONS = ("drop_failed", "model", "log_type")


def detect_csv_format(header: list[str]) -> str | None:
    """By the columns it shares with each format; the loader then names any missing one."""
    names = {h.strip() for h in header}
    azure = len(names & set(AZURE_COLUMNS))
    burst = len(names & {*BURSTGPT_COLUMNS, "Model", "Total tokens", "Log Type"})
    if azure or burst:
        return "azure" if azure >= burst else "burstgpt"
    return None


def _digits(text: str, lo: int, hi: int, what: str) -> int:
    part = text[lo:hi]
    if not (part.isascii() and part.isdigit()):
        raise ValueError(what)
    return int(part)


def _minute_s(s: str) -> int:
    """Seconds since 0001-01-01 for the `YYYY-MM-DD HH:MM` head of a wall-clock string."""
    if s[4] != "-" or s[7] != "-" or s[10] not in " T" or s[13] != ":":
        raise ValueError("layout")
    _digits(s, 0, 4, "year"), _digits(s, 5, 7, "month"), _digits(s, 8, 10, "day")
    day = dt.date.fromisoformat(s[:10]).toordinal()
    h, m = _digits(s, 11, 13, "hour"), _digits(s, 14, 16, "minute")
    if h > 23 or m > 59:
        raise ValueError("time out of range")
    return day * 86400 + h * 3600 + m * 60


def parse_wallclock_ns(text: str, minutes: dict[str, int]) -> int:
    """`YYYY-MM-DD HH:MM:SS[.fffffffff][Z|±HH:MM]` as integer ns since 0001-01-01 UTC.

    Exact integers, so 100 ns digits survive. `minutes` caches each `YYYY-MM-DD HH:MM` head
    (rows of a trace share them), which keeps this ~3x faster than datetime.strptime.
    """
    s = text.strip()
    if len(s) < 19 or s[16] != ":":
        raise ValueError("layout")
    base = minutes.get(s[:16])
    if base is None:
        base = minutes[s[:16]] = _minute_s(s)
    sec = _digits(s, 17, 19, "second")
    if sec > 60:
        raise ValueError("time out of range")
    rest, offset_s = s[19:], 0
    if rest.endswith("Z"):
        rest = rest[:-1]
    elif len(rest) >= 6 and rest[-6] in "+-" and rest[-3] == ":":
        sign = 1 if rest[-6] == "+" else -1
        offset_s = sign * (_digits(rest, -5, -3, "tz") * 3600 + _digits(rest, -2, None, "tz") * 60)
        rest = rest[:-6]
    frac_ns = 0
    if rest:
        if rest[0] != "." or not 2 <= len(rest) <= 10:
            raise ValueError("fraction")
        frac_ns = _digits(rest, 1, None, "fraction") * 10 ** (10 - len(rest))
    return (base + sec - offset_s) * 10**9 + frac_ns


def _column_index(header: list[str], columns: tuple[str, ...], where: str) -> dict[str, int]:
    stripped = [h.strip() for h in header]
    for col in columns:
        if col not in stripped:
            raise WorkloadError(f"{where}: missing column '{col}' (header: {','.join(header)})")
    return {col: stripped.index(col) for col in stripped}


def _rows(reader: Iterator[list[str]], index: dict[str, int], need: tuple[str, ...], name: str):
    """("file:line", fields) per non-blank row; a short row names the first missing column."""
    width = max(index[c] for c in need) + 1
    for fields in reader:
        if len(fields) < width:
            if not fields or (len(fields) == 1 and not fields[0].strip()):
                continue  # blank line
            missing = next(c for c in need if index[c] >= len(fields))
            raise WorkloadError(f"{name}:{reader.line_num}: missing column '{missing}'")  # type: ignore[attr-defined]
        yield f"{name}:{reader.line_num}", fields  # type: ignore[attr-defined]


def read_azure(path: str | Path, skipped: Counter) -> Iterator[TraceRow]:
    name = display_name(path)
    with open_text(path) as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise WorkloadError(f"{name}:1: empty file, expected a CSV header")
        index = _column_index(header, AZURE_COLUMNS, f"{name}:1")
        minutes: dict[str, int] = {}
        first_ns: int | None = None
        i_ts, i_ctx, i_gen = (index[c] for c in AZURE_COLUMNS)
        for where, row in _rows(reader, index, AZURE_COLUMNS, name):
            try:
                ns = parse_wallclock_ns(row[i_ts], minutes)
            except ValueError:
                raise WorkloadError(f"{where}: bad timestamp in TIMESTAMP: {row[i_ts]!r}") from None
            first_ns = ns if first_ns is None else first_ns
            out = TraceRow(
                arrival_s=(ns - first_ns) / 1e9,
                prompt_len=parse_length(row[i_ctx], "ContextTokens", where),
                output_len=parse_length(row[i_gen], "GeneratedTokens", where),
            )
            if replayable(out, skipped):
                yield out


def read_burstgpt(
    path: str | Path,
    skipped: Counter,
    drop_failed: bool = True,
    model: str | None = None,
    log_type: str | None = None,
) -> Iterator[TraceRow]:
    name = display_name(path)
    need = BURSTGPT_COLUMNS + (("Model",) if model else ()) + (("Log Type",) if log_type else ())
    with open_text(path) as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise WorkloadError(f"{name}:1: empty file, expected a CSV header")
        index = _column_index(header, need, f"{name}:1")
        for where, row in _rows(reader, index, need, name):
            t = parse_seconds(row[index["Timestamp"]], "Timestamp", where)
            prompt = parse_length(row[index["Request tokens"]], "Request tokens", where)
            output = parse_length(row[index["Response tokens"]], "Response tokens", where)
            if model and row[index["Model"]].strip() != model:
                skipped["model"] += 1
            elif log_type and row[index["Log Type"]].strip() != log_type:
                skipped["log_type"] += 1
            elif drop_failed and output == 0:
                skipped["failed"] += 1
            else:
                yield TraceRow(arrival_s=t, prompt_len=prompt, output_len=output)
