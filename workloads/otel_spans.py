"""Reading spans out of OpenTelemetry trace files: the OTLP JSON export
(`resourceSpans[].scopeSpans[].spans[]`, attributes as `{key, value: AnyValue}`) and the flat
layout (`{"spans": [{span_id, trace_id, name, start_time, end_time, attributes: {...}}]}`,
inference-perf's and most SDK file exporters'); and the LLM call a span records, by the GenAI
semantic conventions (`gen_ai.input.messages`, `gen_ai.output.messages`,
`gen_ai.system_instructions`, `gen_ai.tool.definitions`, `gen_ai.usage.*`) or by OpenInference's
(Arize Phoenix: `llm.input_messages.{i}.message.*`, `llm.output_messages.*`,
`llm.token_count.*`, `llm.tools.{i}.tool.json_schema`, `openinference.span.kind`).
Messages come out in the OpenAI chat shape, the one the load generator sends.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from cbbench.workloads.errors import WorkloadError

LLM_OPERATIONS = ("chat", "text_completion", "generate_content")
DETAILS_EVENT = "gen_ai.client.inference.operation.details"  # may hold the messages instead


@dataclass
class Span:
    id: str
    trace: str
    name: str
    start_ns: int
    end_ns: int
    attrs: dict[str, Any]
    links: list[str] = field(default_factory=list)  # span ids this span links to (same trace)


def any_value(v: Any) -> Any:
    """An OTLP JSON AnyValue -> a Python value."""
    if not isinstance(v, dict):
        return v
    for key in ("stringValue", "boolValue", "doubleValue", "bytesValue"):
        if key in v:
            return v[key]
    if "intValue" in v:
        return int(v["intValue"])
    if "arrayValue" in v:
        return [any_value(x) for x in (v["arrayValue"] or {}).get("values", [])]
    if "kvlistValue" in v:
        return {kv["key"]: any_value(kv.get("value")) for kv in v["kvlistValue"].get("values", [])}
    return None


def _attrs(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, list):
        return {
            a["key"]: any_value(a.get("value")) for a in raw if isinstance(a, dict) and "key" in a
        }
    return {}


def _time_ns(v: Any) -> int | None:
    """Unix nanoseconds (OTLP), an ISO 8601 string, or a number (s, ms, us or ns by size)."""
    if isinstance(v, str):
        if re.fullmatch(r"\d+", v):
            return int(v)
        try:
            t = dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
        except ValueError:
            return None
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.timezone.utc)
        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
        return (t - epoch) // dt.timedelta(microseconds=1) * 1000
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        return None
    for scale, above in ((1, 1e17), (1e3, 1e14), (1e6, 1e11)):
        if v > above:
            return int(v * scale)
    return int(v * 1e9)


def _span(raw: dict, where: str) -> Span:
    sid = raw.get("spanId", raw.get("span_id"))
    if not isinstance(sid, str) or not sid:
        raise WorkloadError(f"{where}: a span without a span id ({str(raw)[:80]})")
    start_raw = raw.get("startTimeUnixNano", raw.get("start_time"))
    end_raw = raw.get("endTimeUnixNano", raw.get("end_time"))
    start, end = _time_ns(start_raw), _time_ns(end_raw)
    if start is None or end is None:
        bad = "start" if start is None else "end"
        got = start_raw if start is None else end_raw
        raise WorkloadError(f"{where}: span {sid}: bad timestamps: {bad} time {got!r}")
    if end < start:
        raise WorkloadError(
            f"{where}: span {sid}: bad timestamps: ends {(start - end) / 1e9:.6g} s before it starts"
        )
    links = [
        lk.get("spanId", lk.get("span_id"))
        for lk in raw.get("links") or []
        if isinstance(lk, dict) and lk.get("spanId", lk.get("span_id"))
    ]
    attrs = _attrs(raw.get("attributes"))
    for ev in raw.get("events") or []:  # content recorded on the details event instead
        if isinstance(ev, dict) and ev.get("name") == DETAILS_EVENT:
            attrs = {**_attrs(ev.get("attributes")), **attrs}
    return Span(
        id=sid,
        trace=str(raw.get("traceId", raw.get("trace_id")) or ""),
        name=str(raw.get("name") or ""),
        start_ns=start,
        end_ns=end,
        attrs=attrs,
        links=links,
    )


def load_objects(text: str, where: str) -> list[Any]:
    """A trace file's JSON: one object, or one per line (the collector's file exporter)."""
    try:
        return [json.loads(text)]
    except json.JSONDecodeError as exc:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if len(lines) < 2:
            raise WorkloadError(f"{where}: not a readable JSON trace: {exc}") from None
    out = []
    for n, line in enumerate(lines, start=1):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{where}:{n}: not valid JSON: {exc.msg}") from None
    return out


def read_spans(obj: Any, where: str) -> list[Span]:
    """Every span of one parsed trace file (OTLP JSON export or the flat `spans` layout)."""
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: an OpenTelemetry trace is a JSON object")
    raws: list[dict] = []
    if "resourceSpans" in obj:
        for rs in obj["resourceSpans"] or []:
            for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or []:
                raws.extend(ss.get("spans") or [])
    else:
        raws = obj.get("spans") or []
        if not isinstance(raws, list):
            raise WorkloadError(f"{where}: 'spans' must be a list")
    return [_span(r, where) for r in raws if isinstance(r, dict)]


def _json(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return json.loads(v)
        except json.JSONDecodeError:
            return v
    return v


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return json.dumps(content)


def chat_message(m: Any) -> list[dict]:
    """One recorded message -> OpenAI chat messages (a message of several tool results is
    one `tool` message each). GenAI `parts` (text, tool_call, tool_call_response) or the
    OpenAI shape (`content`, `tool_calls`, `tool_call_id`)."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        return []
    role = m["role"]
    if "parts" not in m:
        out = {"role": role, "content": _text(m.get("content"))}
        if m.get("tool_calls"):
            out["tool_calls"] = m["tool_calls"]
        if m.get("tool_call_id"):
            out["tool_call_id"] = m["tool_call_id"]
        return [out]
    texts, calls, results = [], [], []
    for p in m.get("parts") or []:
        if not isinstance(p, dict):
            continue
        kind = p.get("type")
        if kind == "text":
            texts.append(_text(p.get("content")))
        elif kind == "tool_call":
            args = p.get("arguments")
            calls.append(
                {
                    "id": str(p.get("id") or f"call_{len(calls)}"),
                    "type": "function",
                    "function": {
                        "name": str(p.get("name") or "tool"),
                        "arguments": args if isinstance(args, str) else json.dumps(args or {}),
                    },
                }
            )
        elif kind == "tool_call_response":
            resp = p.get("response")
            results.append(
                {
                    "role": "tool",
                    "tool_call_id": str(p.get("id") or ""),
                    "content": resp if isinstance(resp, str) else json.dumps(resp),
                }
            )
    if results:
        return results
    out = {"role": role, "content": "".join(texts)}
    if calls:
        out["tool_calls"] = calls
    return [out]


def _openinference_messages(attrs: dict, prefix: str) -> list[dict] | None:
    """`llm.input_messages.{i}.message.role/content/tool_calls.{j}.tool_call.*` -> messages."""
    rows: dict[int, dict] = {}
    pat = re.compile(re.escape(prefix) + r"\.(\d+)\.message\.(.+)")
    for k, v in attrs.items():
        m = pat.fullmatch(k)
        if m:
            rows.setdefault(int(m.group(1)), {})[m.group(2)] = v
    if not rows:
        return None
    out = []
    for _, f in sorted(rows.items()):
        content = _text(f.get("content"))
        if not content:  # multimodal: contents.{j}.message_content.text, in order
            parts = sorted(
                (int(m.group(1)), v)
                for k, v in f.items()
                if (m := re.fullmatch(r"contents\.(\d+)\.message_content\.text", k))
            )
            content = "".join(str(v) for _, v in parts)
        msg: dict = {"role": str(f.get("role", "user")), "content": content}
        calls: dict[int, dict] = {}
        for k, v in f.items():
            c = re.fullmatch(r"tool_calls\.(\d+)\.tool_call\.(.+)", k)
            if c:
                calls.setdefault(int(c.group(1)), {})[c.group(2)] = v
        if calls:
            msg["tool_calls"] = [
                {
                    "id": str(c.get("id") or f"call_{j}"),
                    "type": "function",
                    "function": {
                        "name": str(c.get("function.name") or "tool"),
                        "arguments": str(c.get("function.arguments") or "{}"),
                    },
                }
                for j, c in sorted(calls.items())
            ]
        if f.get("tool_call_id"):
            msg["tool_call_id"] = str(f["tool_call_id"])
        out.append(msg)
    return out


@dataclass
class LLMCall:
    """What one LLM span recorded, in the chat shape."""

    messages: list[dict]
    output: dict  # the assistant message it answered with
    tools: list[dict]
    input_tokens: int | None
    output_tokens: int | None
    max_tokens: int | None


def _messages(v: Any) -> list[dict] | None:
    v = _json(v)
    if not isinstance(v, list):
        return None
    return [c for m in v for c in chat_message(_json(m))]


def _tool(t: Any) -> dict | None:
    t = _json(t)
    if not isinstance(t, dict):
        return None
    if "function" in t:
        return t
    if "name" in t:  # the GenAI / Responses flat shape
        fn = {k: t[k] for k in ("name", "description", "parameters") if k in t}
        return {"type": "function", "function": fn}
    return None


def _int(v: Any) -> int | None:
    try:
        return int(v) if v is not None and not isinstance(v, bool) else None
    except (TypeError, ValueError):
        return None


def llm_kind(span: Span) -> str | None:
    """Why a span is an LLM call (the convention that says so), or None."""
    a = span.attrs
    op = a.get("gen_ai.operation.name")
    if op in LLM_OPERATIONS or "gen_ai.input.messages" in a:
        return "genai"
    if a.get("openinference.span.kind") == "LLM":
        return "openinference"
    if op is None and span.name.split(" ")[0] in LLM_OPERATIONS and "gen_ai.request.model" in a:
        return "genai"
    return None


def llm_call(span: Span, kind: str) -> LLMCall | None:
    """The call a span records; None when it has no input messages."""
    a = span.attrs
    if kind == "openinference":
        msgs = _openinference_messages(a, "llm.input_messages")
        outs = _openinference_messages(a, "llm.output_messages") or []
        tools = [
            _tool(v)
            for k, v in sorted(a.items())
            if re.fullmatch(r"llm\.tools\.\d+\.tool\.json_schema", k)
        ]
        n_in, n_out = (
            _int(a.get("llm.token_count.prompt")),
            _int(a.get("llm.token_count.completion")),
        )
        max_tokens = None
    else:
        msgs = _messages(a.get("gen_ai.input.messages"))
        system = _json(a.get("gen_ai.system_instructions"))
        if msgs is not None and system and not any(m["role"] == "system" for m in msgs):
            parts = system if isinstance(system, list) else [{"type": "text", "content": system}]
            msgs = [*chat_message({"role": "system", "parts": parts}), *msgs]
        outs = _messages(a.get("gen_ai.output.messages")) or []
        if not outs and isinstance(a.get("gen_ai.output.text"), str):
            outs = [{"role": "assistant", "content": a["gen_ai.output.text"]}]
        defs = _json(a.get("gen_ai.tool.definitions"))
        tools = [_tool(t) for t in defs] if isinstance(defs, list) else []
        n_in = _int(a.get("gen_ai.usage.input_tokens", a.get("gen_ai.usage.prompt_tokens")))
        n_out = _int(a.get("gen_ai.usage.output_tokens", a.get("gen_ai.usage.completion_tokens")))
        max_tokens = _int(a.get("gen_ai.request.max_tokens"))
    if not msgs:
        return None
    output = next((m for m in outs if m.get("role") == "assistant"), None) or {
        "role": "assistant",
        "content": "",
    }
    return LLMCall(msgs, output, [t for t in tools if t], n_in, n_out, max_tokens)
