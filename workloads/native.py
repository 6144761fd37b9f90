"""Native cbbench JSONL: an optional header object, then one RequestSpec per line, every field.

```
{"cbbench_workload": 1, "name": "mixed", "seed": 0, "prefix_block_size": 512, "source": {...}}
{"index": 0, "prompt_len": 312, "output_len": 87, "arrival_s": null, "priority": 0,
 "prefix_ids": [], "session_id": null, "turn": null, "think_s": null, "text": null}
```
Only `prompt_len` and `output_len` are required on a request line; `index` defaults to the
line's position. Floats are written with repr, so a write/read round trip is exact.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

from cbbench.workloads.agent_trace import parse_agent_step
from cbbench.workloads.errors import WorkloadError
from cbbench.workloads.graph import check_graph, parse_graph_call
from cbbench.workloads.spec import RequestSpec, Workload
from cbbench.workloads.trace_mooncake import json_lines, parse_ids
from cbbench.workloads.tracefile import parse_length

HEADER_KEY = "cbbench_workload"
FORMAT_VERSION = 1
REQUEST_FIELDS = tuple(f.name for f in dataclasses.fields(RequestSpec))
HEADER_FIELDS = (HEADER_KEY, "name", "seed", "prefix_block_size", "source")


def is_native_object(obj: object) -> bool:
    return isinstance(obj, dict) and (HEADER_KEY in obj or "prompt_len" in obj)


def _request(obj: dict, position: int, where: str) -> RequestSpec:
    for key in obj:
        if key not in REQUEST_FIELDS:
            raise WorkloadError(
                f"{where}: unknown key '{key}' (fields: {', '.join(REQUEST_FIELDS)})"
            )
    for key in ("prompt_len", "output_len"):
        if key not in obj:
            raise WorkloadError(f"{where}: missing column '{key}'")
    arrival = obj.get("arrival_s")
    if arrival is not None and (
        isinstance(arrival, bool)
        or not isinstance(arrival, (int, float))
        or not math.isfinite(arrival)
        or arrival < 0
    ):
        raise WorkloadError(f"{where}: bad timestamp in arrival_s: {arrival!r}")
    for key in ("priority", "turn"):
        value = obj.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise WorkloadError(f"{where}: {key} must be an integer, got {value!r}")
    session = obj.get("session_id")
    if session is not None and not isinstance(session, str):
        raise WorkloadError(f"{where}: session_id must be a string, got {session!r}")
    think = obj.get("think_s")
    if think is not None and (
        isinstance(think, bool)
        or not isinstance(think, (int, float))
        or not math.isfinite(think)
        or think < 0
    ):
        raise WorkloadError(f"{where}: think_s must be a number >= 0, got {think!r}")
    text = obj.get("text")
    if text is not None and not isinstance(text, str):
        raise WorkloadError(f"{where}: text must be a string, got {text!r}")
    return RequestSpec(
        index=parse_length(obj.get("index", position), "index", where),
        prompt_len=parse_length(obj["prompt_len"], "prompt_len", where),
        output_len=parse_length(obj["output_len"], "output_len", where),
        arrival_s=None if arrival is None else float(arrival),
        priority=obj.get("priority") or 0,
        prefix_ids=parse_ids(obj.get("prefix_ids", []), "prefix_ids", where),
        session_id=session,
        turn=obj.get("turn"),
        think_s=None if think is None else float(think),
        text=text,
        agent=parse_agent_step(obj.get("agent"), obj.get("turn"), where),
        graph=parse_graph_call(obj.get("graph"), where),
    )


def read_native(path: str | Path, name: str, num_requests: int | None = None) -> Workload:
    header: dict = {}
    requests: list[RequestSpec] = []
    for where, obj in json_lines(path):
        if not isinstance(obj, dict):
            raise WorkloadError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        if HEADER_KEY in obj:
            if requests or header:
                raise WorkloadError(f"{where}: the '{HEADER_KEY}' header must be the first line")
            for key in obj:
                if key not in HEADER_FIELDS:
                    raise WorkloadError(f"{where}: unknown header key '{key}'")
            if obj[HEADER_KEY] != FORMAT_VERSION:
                raise WorkloadError(f"{where}: unsupported format version {obj[HEADER_KEY]!r}")
            header = obj
            continue
        if num_requests is not None and len(requests) >= num_requests:
            break  # N = 0: the header is read, no request
        requests.append(_request(obj, len(requests), where))
        if num_requests is not None and len(requests) >= num_requests:
            break  # stop parsing once N are taken
    check_graph(requests, str(path))
    source = header.get("source", {"format": "native", "path": str(path)})
    return Workload(
        name=header.get("name", name),
        seed=int(header.get("seed", 0)),
        requests=tuple(requests),
        prefix_block_size=int(header.get("prefix_block_size", 512)),
        source=source,
    )


def write_native_jsonl(wl: Workload, path: str | Path) -> None:
    """Write `wl` as native JSONL (atomically: a temp file renamed into place)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    header = {
        HEADER_KEY: FORMAT_VERSION,
        "name": wl.name,
        "seed": wl.seed,
        "prefix_block_size": wl.prefix_block_size,
        "source": wl.source,
    }
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(header, default=str) + "\n")
            for r in wl.requests:
                row = dataclasses.asdict(r)
                row["prefix_ids"] = list(r.prefix_ids)
                f.write(json.dumps(row) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot write: {exc.strerror or exc}") from None
