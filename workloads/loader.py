"""`load_workload(spec)`: a preset name, a trace file, or a TOML/JSON spec file -> Workload.

Trace formats are told apart by suffix (.gz stripped) and content: .csv by its header (Azure or
BurstGPT), .jsonl by its first line (native cbbench, Mooncake or ShareGPT), .json by its first
character (`{` a spec file, `[` a ShareGPT array), .toml is a spec file.
"""

from __future__ import annotations

import copy
import json
import sys
from collections import Counter
from pathlib import Path

from cbbench.workloads.agent import build_agent
from cbbench.workloads.agent_graph import build_agent_graph
from cbbench.workloads.agent_trace import as_agent_sessions, is_agent_trace_object, read_agent_trace
from cbbench.workloads.arrivals import with_arrivals
from cbbench.workloads.errors import WorkloadError
from cbbench.workloads.inline import is_inline, parse_inline
from cbbench.workloads.native import is_native_object, read_native
from cbbench.workloads.presets import PRESETS
from cbbench.workloads.sessions import chain_sessions
from cbbench.workloads.shared_prefix import build_shared_prefix
from cbbench.workloads.spec import Workload
from cbbench.workloads.stream import (
    STREAM_ABOVE,
    LengthCounts,
    check_count,
    streamable,
    summarize_streamed,
)
from cbbench.workloads.synthetic import DEFAULT_NUM_REQUESTS, build_synthetic
from cbbench.workloads.trace_csv import (
    BURSTGPT_OPTIONS,
    detect_csv_format,
    read_azure,
    read_burstgpt,
)
from cbbench.workloads.trace_mooncake import MOONCAKE_BLOCK_SIZE, read_mooncake
from cbbench.workloads.trace_otel import is_otel_trace, read_otel
from cbbench.workloads.trace_sharegpt import read_sharegpt
from cbbench.workloads.tracefile import (
    PACKAGED_PREFIX,
    build_trace_workload,
    display_name,
    open_text,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

SPEC_KEYS = (
    "name", "description", "seed", "num_requests", "trace", "arrival",
    "prompt", "output", "priority", "prefix", "mixture", "session", "agent", "shared_prefix",
    "agent_graph",
)  # fmt: skip
GENERATOR_KEYS = ("agent", "shared_prefix", "agent_graph")  # a whole workload from one table
TRACE_KEYS = ("path", "format", "tokenizer", "sessions", "agent", *BURSTGPT_OPTIONS)
SESSION_FORMATS = ("mooncake", "sharegpt")  # traces whose sessions can be recovered
TRACE_FORMATS = ("azure", "burstgpt", "mooncake", "sharegpt", "native", "agent", "otel")
HEAD_CHARS = 1 << 20  # format detection reads no further
ARRIVAL_KEYS = ("kind", "rate", "cv", "time_scale", "target_rate", "ramp_up_s")


def _first_text(path: str | Path) -> tuple[int, str]:
    """(line number, text) of the first non-blank line, read from at most HEAD_CHARS
    characters (a minified JSON file is one huge line); (1, '') for an empty file."""
    with open_text(path) as f:
        head = f.read(HEAD_CHARS)
    for number, line in enumerate(head.splitlines(), start=1):
        if line.strip():
            return number, line.strip()
    return 1, ""


def detect_format(path: str | Path) -> str:
    name = display_name(path)
    suffix = Path(name.removesuffix(".gz")).suffix.lower()
    line, first = _first_text(path)
    if suffix == ".csv":
        fmt = detect_csv_format(first.split(","))
        if fmt is None:
            raise WorkloadError(
                f"{name}:{line}: unknown CSV header {first!r}: expected Azure "
                "(TIMESTAMP,ContextTokens,GeneratedTokens) or BurstGPT (Timestamp,...)"
            )
        return fmt
    if suffix == ".jsonl":
        if not first:
            return "native"
        try:
            obj = json.loads(first)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{name}:{line}: not valid JSON: {exc.msg}") from None
        if is_native_object(obj):
            return "native"
        if is_agent_trace_object(obj):
            return "agent"
        if isinstance(obj, dict) and "input_length" in obj:
            return "mooncake"
        if isinstance(obj, dict) and "conversations" in obj:
            return "sharegpt"
        raise WorkloadError(
            f"{name}:{line}: cannot tell the JSONL format: expected native cbbench "
            "(prompt_len), agent trace (step, input_tokens), Mooncake (input_length) or "
            "ShareGPT (conversations) keys"
        )
    if suffix == ".json" and first.startswith("["):
        return "sharegpt"
    if suffix in (".json", ".toml"):
        return "spec"
    raise WorkloadError(f"{name}: unknown file type '{suffix}' (.csv, .jsonl, .json, .toml, .gz)")


def load_trace(
    path: str | Path,
    fmt: str | None = None,
    seed: int = 0,
    num_requests: int | None = None,
    tokenizer: str | Path | None = None,
    name: str | None = None,
    sessions: bool = False,
    agent: bool = False,
    **options,
) -> Workload:
    """One trace file as a workload; `options` are the BurstGPT filters. `sessions`: Mooncake
    requests chained into conversations by their block ids, ShareGPT conversations sent turn
    by turn with their real text."""
    name = name or display_name(path)
    if fmt is None and is_otel_trace(Path(path)):
        fmt = "otel"
    fmt = fmt or detect_format(path)
    if fmt not in TRACE_FORMATS:
        raise WorkloadError(
            f"{name}: unknown trace format {fmt!r} (one of {', '.join(TRACE_FORMATS)})"
        )
    if options and fmt != "burstgpt":
        raise WorkloadError(f"{name}: {', '.join(options)} only apply to BurstGPT traces")
    if tokenizer is not None and fmt != "sharegpt":
        raise WorkloadError(f"{name}: a tokenizer only applies to ShareGPT traces")
    if not isinstance(sessions, bool):
        raise WorkloadError(f"{name}: 'sessions' must be true or false, got {sessions!r}")
    if sessions and fmt not in SESSION_FORMATS:
        raise WorkloadError(
            f"{name}: sessions are recovered from {' and '.join(SESSION_FORMATS)} traces, "
            f"not {fmt} (native JSONL keeps its own session_id/turn)"
        )
    if agent and not (sessions and fmt == "mooncake"):
        raise WorkloadError(
            f"{name}: 'agent' turns chained Mooncake sessions into agent steps "
            "(format mooncake, sessions true)"
        )
    if fmt == "native":
        return read_native(path, name, num_requests)
    if fmt == "agent":
        return read_agent_trace(path, name, seed, num_requests)
    if fmt == "otel":  # OpenTelemetry GenAI spans: a file or a folder (trace_otel.py)
        return read_otel(path, name, seed, num_requests)
    skipped: Counter = Counter()
    readers = {
        "azure": lambda: read_azure(path, skipped),
        "burstgpt": lambda: read_burstgpt(path, skipped, **options),
        "mooncake": lambda: read_mooncake(path, skipped),
        "sharegpt": lambda: read_sharegpt(path, skipped, tokenizer, sessions),
    }
    source = {"format": fmt, "path": display_name(path)}
    if options:
        source["options"] = dict(options)
    block = MOONCAKE_BLOCK_SIZE if fmt == "mooncake" else 512
    wl = build_trace_workload(readers[fmt](), name, seed, num_requests, source, skipped, block)
    if sessions and fmt == "mooncake":
        wl = chain_sessions(wl)
        return as_agent_sessions(wl) if agent else wl
    return wl


def _check_int(value: object, key: str, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise WorkloadError(f"{where}: '{key}' must be an integer >= {minimum}, got {value!r}")
    return value


def _trace_from_spec(
    trace: object, where: str, base: Path | None, seed: int, n: int | None, name: str
):
    if isinstance(trace, str):
        trace = {"path": trace}
    if not isinstance(trace, dict) or "path" not in trace:
        raise WorkloadError(f"{where}: 'trace' must be a path or a table with 'path'")
    for key in trace:
        if key not in TRACE_KEYS:
            raise WorkloadError(
                f"{where}: trace: unknown key '{key}' (keys: {', '.join(TRACE_KEYS)})"
            )
    opts = dict(trace)
    path = str(opts.pop("path"))
    fmt = opts.pop("format", None)
    tokenizer = opts.pop("tokenizer", None)
    sessions = opts.pop("sessions", False)
    agent = opts.pop("agent", False)
    if path in PRESETS and "trace" in PRESETS[path].spec:
        preset_trace = PRESETS[path].spec["trace"]
        path, fmt = preset_trace["path"], fmt or preset_trace["format"]
    elif base is not None and not path.startswith(PACKAGED_PREFIX) and not Path(path).is_absolute():
        path = str(base / path)
    if base is not None and tokenizer is not None and not Path(tokenizer).is_absolute():
        tokenizer = str(base / tokenizer)
    return load_trace(path, fmt, seed, n, tokenizer, name, sessions, agent, **opts)


def _resolve_traces(node: object, base: Path | None) -> object:
    """A copy of a spec with empirical `trace` paths made relative to the spec file's folder."""
    if isinstance(node, list):
        return [_resolve_traces(v, base) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _resolve_traces(v, base) for k, v in node.items()}
    trace = out.get("trace")
    relative = isinstance(trace, str) and trace not in PRESETS and not Path(trace).is_absolute()
    if base is not None and out.get("dist") == "empirical" and relative:
        out["trace"] = str(base / trace)  # type: ignore[operator]
    if out.get("dist") == "empirical" and isinstance(out.get("trace"), str) and "values" not in out:
        column = out.get("column")
        if column in ("prompt", "output"):  # else parse_dist names what is missing
            attr = "prompt_len" if column == "prompt" else "output_len"
            wl = load_workload(out["trace"])  # a trace is itself a workload
            if not wl.requests:
                raise WorkloadError(f"empirical: trace '{out['trace']}' has no requests")
            del out["trace"], out["column"]
            out["values"] = [getattr(r, attr) for r in wl.requests]
    return out


def build_from_spec(
    spec: dict,
    name: str,
    where: str,
    seed: int | None = None,
    num_requests: int | None = None,
    base: Path | None = None,
) -> Workload:
    """A workload from a spec table (a spec file's content or a preset); see the README."""
    for key in spec:
        if key not in SPEC_KEYS:
            raise WorkloadError(f"{where}: unknown key '{key}' (keys: {', '.join(SPEC_KEYS)})")
    seed = _check_int(spec.get("seed", 0) if seed is None else seed, "seed", where, 0)
    if num_requests is None and "num_requests" in spec:
        num_requests = spec["num_requests"]
    if num_requests is not None:
        num_requests = _check_int(num_requests, "num_requests", where, 0)
        check_count(num_requests, where)
    name = spec.get("name", name)
    if "trace" in spec:
        extra = [
            k for k in ("prompt", "output", "priority", "prefix", "mixture", "session") if k in spec
        ]
        if extra:
            raise WorkloadError(f"{where}: '{extra[0]}' cannot be combined with 'trace'")
        wl = _trace_from_spec(spec["trace"], where, base, seed, num_requests, name)
    elif any(k in spec for k in GENERATOR_KEYS):
        wl = _generated(spec, name, seed, num_requests, where)
    else:
        n = DEFAULT_NUM_REQUESTS if num_requests is None else num_requests
        wl = build_synthetic(_resolve_traces(spec, base), name, seed, n, where)
    if "arrival" in spec:
        arrival = spec["arrival"]
        if not isinstance(arrival, dict) or "kind" not in arrival:
            raise WorkloadError(f"{where}: 'arrival' must be a table with 'kind'")
        for key in arrival:
            if key not in ARRIVAL_KEYS:
                raise WorkloadError(
                    f"{where}: arrival: unknown key '{key}' (keys: {', '.join(ARRIVAL_KEYS)})"
                )
        try:
            wl = with_arrivals(wl, seed=seed, **arrival)
        except WorkloadError as exc:
            raise WorkloadError(f"{where}: {exc}") from None
    source = {"spec": copy.deepcopy(spec)} | wl.source
    return Workload(wl.name, wl.seed, wl.requests, wl.prefix_block_size, source)


def _generated(spec: dict, name: str, seed: int, n: int | None, where: str) -> Workload:
    """An `agent` or `shared_prefix` table: the workload its generator makes."""
    keys = [k for k in spec if k in GENERATOR_KEYS or k in ("prompt", "output", "prefix")]
    keys += [k for k in ("priority", "mixture", "session") if k in spec]
    gen = next(k for k in GENERATOR_KEYS if k in spec)
    other = [k for k in keys if k != gen]
    if other:
        raise WorkloadError(f"{where}: '{other[0]}' cannot be combined with '{gen}'")
    if gen == "agent":
        return build_agent(spec[gen], name, seed, DEFAULT_NUM_REQUESTS if n is None else n, where)
    if gen == "agent_graph":
        n = DEFAULT_NUM_REQUESTS if n is None else n
        return build_agent_graph(spec[gen], name, seed, n, where)
    wl = build_shared_prefix(spec[gen], name, seed, where)
    if n is not None and n < len(wl.requests):
        wl = Workload(wl.name, wl.seed, wl.requests[:n], wl.prefix_block_size, wl.source)
    return wl


def read_spec_file(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot open: {exc.strerror or exc}") from None
    try:
        spec = tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise WorkloadError(f"{path}: not a valid spec file: {exc}") from None
    if not isinstance(spec, dict):
        raise WorkloadError(f"{path}: a spec file holds one table/object")
    return spec


def load_workload(
    spec: str | Path,
    seed: int | None = None,
    num_requests: int | None = None,
    tokenizer: str | Path | None = None,
) -> Workload:
    """Load a preset, trace or spec file. `seed`/`num_requests` override the spec's own;
    `num_requests` takes the first N (the same prefix whatever N); None = the spec's default
    (all rows for a trace). `tokenizer` (a tokenizer.json) counts ShareGPT tokens."""
    if num_requests is not None:
        _check_int(num_requests, "num_requests", str(spec), 0)
        check_count(num_requests, str(spec))
    key = str(spec)
    if key in PRESETS:
        preset = PRESETS[key]
        if tokenizer is not None:
            raise WorkloadError(f"{key}: a tokenizer only applies to ShareGPT traces")
        wl = build_from_spec(preset.spec, key, f"preset {key}", seed, num_requests)
        return Workload(
            wl.name, wl.seed, wl.requests, wl.prefix_block_size, {"preset": key} | wl.source
        )
    path = Path(key)
    if is_otel_trace(path):  # a file or a folder of OpenTelemetry GenAI traces
        if tokenizer is not None:
            raise WorkloadError(f"{path}: a tokenizer only applies to ShareGPT traces")
        return read_otel(path, key, seed or 0, num_requests)
    if not path.is_file() and is_inline(key):  # prompt=128,output=128: fixed lengths
        return build_from_spec(parse_inline(key), key, f"--workload {key}", seed, num_requests)
    if not path.is_file():
        names = ", ".join(PRESETS)
        raise WorkloadError(f"unknown workload '{key}': not a preset ({names}) and no such file")
    fmt = detect_format(path)
    if fmt == "spec":
        if tokenizer is not None:
            raise WorkloadError(f"{path}: give the tokenizer inside the spec file's trace table")
        return build_from_spec(
            read_spec_file(path), key, str(path), seed, num_requests, path.parent
        )
    return load_trace(path, fmt, seed or 0, num_requests, tokenizer, key)


def summarize_big(
    spec: str | Path, seed: int | None = None, num_requests: int | None = None
) -> tuple[dict, LengthCounts] | None:
    """The summary of a synthetic preset or spec file of more than STREAM_ABOVE requests,
    streamed in bounded memory (workloads/stream.py); None when it is smaller or not a plain
    synthetic spec (then load it)."""
    key, base = str(spec), None
    if key in PRESETS:
        table = PRESETS[key].spec
    else:
        path = Path(key)
        if not path.is_file() or detect_format(path) != "spec":
            return None
        table, base = read_spec_file(path), path.parent
    n = num_requests if num_requests is not None else table.get("num_requests")
    if not isinstance(n, int) or n <= STREAM_ABOVE or not streamable(table):
        return None
    _check_int(n, "num_requests", key, 0)
    seed = _check_int(table.get("seed", 0) if seed is None else seed, "seed", key, 0)
    return summarize_streamed(_resolve_traces(table, base), key, seed, n)
