"""A run folder: `requests.jsonl` (appended as requests finish), `timeseries.jsonl`
(telemetry samples) and `run.json` (config, environment, summary).

The telemetry writer flushes every line. The records' writer flushes a line at once unless
another was flushed less than `RECORD_FLUSH_S` (20 ms) ago; the lines held back go out with
the next record past that, the next telemetry sample (a second at most) or the close (Ctrl-C
too): a write syscall a request was ~6% of the client's CPU at thousands of requests a
second. So a killed process (kill -9, out of memory) loses at most the records that finished
in the last 20 ms before it, and `requests.jsonl` is never more than a second behind for
those who tail it (sweeps' watches). Readers tolerate a torn last line.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cbbench.harness.errors import CbbenchError
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.redact import redact_meta, redact_text

RUN_SCHEMA_VERSION = 1
REQUESTS_FILE = "requests.jsonl"
TIMESERIES_FILE = "timeseries.jsonl"
RUN_FILE = "run.json"
RECORD_FLUSH_S = 0.02  # the most a line of requests.jsonl waits for its flush, under load


def _plain(o: Any) -> Any:  # what the encoders leave to `default`: numpy scalars, others
    if isinstance(o, float):
        return float(o)
    item = getattr(o, "item", None)
    return item() if callable(item) else str(o)


def _finite(o: Any) -> Any:  # NaN/inf -> null, as orjson writes them (JSON has neither)
    if type(o).__module__ == "numpy":
        o = _plain(o)
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def _json_line_std(obj: dict) -> str:
    try:
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False, default=_plain)
    except ValueError:  # a non-finite float somewhere: written as null, the line is kept
        text = json.dumps(_finite(obj), separators=(",", ":"), allow_nan=False, default=_plain)
    return text + "\n"


def _json_bytes_std(obj: dict) -> bytes:
    return _json_line_std(obj).encode()


try:  # optional accelerator (a record a request: ~10x cheaper than the stdlib's encoder)
    import orjson

    def _json_bytes(obj: dict) -> bytes:
        """The line as UTF-8 bytes, written as they come (no str in between)."""
        try:
            return orjson.dumps(obj, default=_plain, option=orjson.OPT_APPEND_NEWLINE)
        except TypeError:  # what orjson refuses (a lone surrogate): the stdlib's escapes
            return _json_bytes_std(obj)

    def _json_line(obj: dict) -> str:
        return _json_bytes(obj).decode()

except ImportError:  # the `fast` extra is not installed
    _json_line = _json_line_std
    _json_bytes = _json_bytes_std


class JsonlAppender:
    """Thread-safe line appender; each line is flushed (and optionally fsync'd), or with
    `max_delay_s`, flushed unless the last flush was less than that long ago (`flush` and
    `close` write what is held back)."""

    def __init__(
        self,
        path: Path,
        fsync: bool = False,
        secrets: tuple[str, ...] = (),
        max_delay_s: float = 0.0,
    ) -> None:
        self.path = path
        self.secrets = tuple(s for s in secrets if s)
        # UTF-8 lines; a buffer that holds a burst's lines between flushes
        self._fh = open(path, "ab", buffering=1 << 18)  # noqa: SIM115 - closed in close()
        self._lock = threading.Lock()
        self._fsync = fsync
        self._delay_ns = int(max_delay_s * 1e9)
        self._flushed_ns = 0  # monotonic time of the last flush (with a delay)
        self._held = False  # lines written since the last flush

    def write(self, obj: dict) -> None:
        line = _json_bytes(obj)
        if self.secrets:  # e.g. a server that echoes the key in an error message
            line = redact_text(line.decode(), self.secrets).encode()
        with self._lock:
            self._fh.write(line)
            if self._delay_ns:
                now = time.monotonic_ns()
                if now - self._flushed_ns < self._delay_ns:
                    self._held = True
                    return
                self._flushed_ns = now
            self._flush()

    def _flush(self) -> None:
        self._held = False
        self._fh.flush()
        if self._fsync:
            os.fsync(self._fh.fileno())

    def flush(self) -> None:
        """Write the lines held back (`max_delay_s`) now."""
        with self._lock:
            if self._held and not self._fh.closed:
                self._flushed_ns = time.monotonic_ns()
                self._flush()

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.close()


class RunWriter:
    """Writes a run folder; `secrets` (the API key in use) never reach it, nor do keys on
    the command line or in secret-named fields (harness/results/redact.py)."""

    def __init__(self, run_dir: str | Path, secrets: tuple[str | None, ...] = ()) -> None:
        self.dir = Path(run_dir)
        self.secrets = tuple(s for s in secrets if s)
        try:
            if self.dir.exists() and not self.dir.is_dir():
                raise CbbenchError(f"{self.dir}: a file, not a folder: give --out a folder")
            self.dir.mkdir(parents=True, exist_ok=True)
            self.requests = JsonlAppender(
                self.dir / REQUESTS_FILE, secrets=self.secrets, max_delay_s=RECORD_FLUSH_S
            )
            self.timeseries = JsonlAppender(self.dir / TIMESERIES_FILE, secrets=self.secrets)
        except OSError as exc:  # /proc/x, a file on the way, no permission, a full disk
            where = exc.filename or self.dir
            raise CbbenchError(
                f"{self.dir}: cannot write the run folder here ({where}: {exc.strerror})"
            ) from None

    def add_record(self, record: RequestRecord) -> None:
        self.requests.write(record.__dict__)  # written at once: no copy (`to_dict`) needed

    def add_sample(self, sample: dict) -> None:
        self.timeseries.write(sample)
        self.requests.flush()  # the records held back (a second behind at most)

    def write_run(self, meta: dict[str, Any]) -> None:
        meta = redact_meta({"schema_version": RUN_SCHEMA_VERSION, **meta})
        text = redact_text(json.dumps(meta, indent=2, default=str), self.secrets)
        tmp = self.dir / (RUN_FILE + ".tmp")
        tmp.write_text(text + "\n", encoding="utf-8")
        os.replace(tmp, self.dir / RUN_FILE)  # atomic: run.json is never half-written

    def flush(self) -> None:
        """The records held back (RECORD_FLUSH_S), on disk now."""
        self.requests.flush()

    def close(self) -> None:
        self.requests.close()
        self.timeseries.close()


def read_jsonl(path: Path) -> list[dict]:
    """Read a JSONL file; a torn *last* line is dropped, a bad line elsewhere is an error."""
    return read_jsonl_torn(path)[0]


def read_jsonl_torn(path: Path) -> tuple[list[dict], bool]:
    """`read_jsonl`, and whether its last line was torn (dropped: the run folder says so)."""
    if not path.exists():
        return [], False
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    out: list[dict] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if i == len(lines):
                return out, True
            raise CbbenchError(f"{path}:{i}: not valid JSON ({exc.msg})") from None
    return out, False


@dataclass
class Run:
    dir: Path
    meta: dict[str, Any]
    records: list[RequestRecord]
    timeseries: list[dict]
    torn: bool = False  # requests.jsonl's last line was torn (dropped)

    @property
    def name(self) -> str:
        return self.meta.get("name") or self.dir.name

    def dataframe(self):  # -> pandas.DataFrame
        import pandas as pd

        return pd.DataFrame([r.to_dict() for r in self.records])


def load_run(run_dir: str | Path) -> Run:
    d = Path(run_dir)
    if not d.is_dir():
        raise CbbenchError(f"{d}: not a run folder (no such directory)")
    req = d / REQUESTS_FILE
    if not req.exists():
        raise CbbenchError(f"{d}: not a run folder (no {REQUESTS_FILE})")
    meta: dict[str, Any] = {}
    if (d / RUN_FILE).exists():
        try:
            meta = json.loads((d / RUN_FILE).read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise CbbenchError(f"{d / RUN_FILE}: not valid JSON ({exc.msg})") from None
        if not isinstance(meta, dict):
            raise CbbenchError(f"{d / RUN_FILE}: expected a JSON object")
        meta = redact_meta(meta)  # runs written before redaction: never print their keys
    records = []
    rows, torn = read_jsonl_torn(req)
    for i, row in enumerate(rows, 1):
        try:
            records.append(RequestRecord.from_dict(row))
        except TypeError as exc:
            raise CbbenchError(f"{req}: record {i}: {exc}") from None
    ts = read_jsonl(d / TIMESERIES_FILE)
    return Run(dir=d, meta=meta, records=records, timeseries=ts, torn=torn)
