"""Agent sessions on `--endpoint responses` and `--endpoint messages`: the chat-shaped steps
(`load/agent.py`) sent in each API's own shapes, checked against a recording server (a real
HTTP server on 127.0.0.1 that logs every body): Responses' `function_call` /
`function_call_output` input items and flat `tools`; Messages' `system` field, `tool_use` /
`tool_result` blocks and `tools` with `input_schema`; the whole history on every step."""

from __future__ import annotations

import io
import json

import httpx
import pytest
from cbbench.harness.client.messages import agent_messages, anthropic_tool
from cbbench.harness.client.responses import flat_tool, input_items
from cbbench.harness.errors import CbbenchError
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.reference_engine.server.runner import ThreadedServer
from cbbench.workloads.loader import build_from_spec
from rich.console import Console

from tests.recording_api_server import recording_api_app
from tests.test_agent_sessions import SPEC

TOOL = {"type": "function", "function": {"name": "f", "description": "d",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}  # fmt: skip
CHAT = [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "task"},
    {"role": "assistant", "content": "thinking aloud",
     "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "f", "arguments": '{"x": 1}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "result"},
]  # fmt: skip


def test_chat_steps_in_each_apis_shapes():
    assert input_items(CHAT) == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "thinking aloud"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "result"},
    ]
    assert flat_tool(TOOL) == {"type": "function", **TOOL["function"]}
    system, msgs = agent_messages(CHAT)
    assert system == "sys"
    assert msgs == [
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "thinking aloud"},
            {"type": "tool_use", "id": "c1", "name": "f", "input": {"x": 1}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": "result"}]},
    ]  # fmt: skip
    tool = anthropic_tool(TOOL)
    assert tool == {"name": "f", "description": "d", "input_schema": TOOL["function"]["parameters"]}
    # arguments that are not a JSON object are kept, not lost
    bad = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "function": {"name": "f", "arguments": "{oops"}}]}]  # fmt: skip
    assert agent_messages(bad)[1][0]["content"] == [
        {"type": "tool_use", "id": "c", "name": "f", "input": {"arguments": "{oops"}}
    ]


def _sessions(log: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for e in log:
        out.setdefault(e["headers"]["x-session-id"], []).append(e)
    return out


@pytest.mark.parametrize("endpoint", ["responses", "messages"])
def test_agent_bench_sends_each_apis_tool_loop(tmp_path, endpoint):
    wl = build_from_spec(SPEC, "agent", "spec", seed=1, num_requests=12)
    log: list[dict] = []
    with ThreadedServer(recording_api_app(log)) as url:
        cfg = BenchConfig(base_url=url, workload=wl, endpoint=endpoint, concurrency=2,
                          out_dir=tmp_path / endpoint, live=False)  # fmt: skip
        res = run_bench(cfg, console=Console(file=io.StringIO(), width=200))
    assert res.summary["counts"]["completed"] == 12
    assert all(r.ok and r.output_tokens_client == r.output_len for r in res.records)
    specs: dict[str, list] = {}
    for q in wl.requests:
        specs.setdefault(q.session_id, []).append(q)
    sessions = _sessions(log)
    assert set(sessions) == set(specs)
    key = "input" if endpoint == "responses" else "messages"
    for sid, entries in sessions.items():
        steps = specs[sid]
        assert len(entries) == len(steps)
        tools = entries[0]["body"]["tools"]
        assert [t["name"] for t in tools] == ["tool_0", "tool_1", "tool_2"]
        assert all(("parameters" if endpoint == "responses" else "input_schema") in t
                   for t in tools)  # fmt: skip
        first = entries[0]["body"]
        if endpoint == "responses":
            assert [m["role"] for m in first["input"]] == ["system", "user"]
        else:
            assert first["system"] and [m["role"] for m in first["messages"]] == ["user"]
        for k in range(1, len(entries)):
            prev, cur = entries[k - 1]["body"][key], entries[k]["body"]
            assert cur["tools"] == tools and cur[key][: len(prev)] == prev  # whole history
            new = cur[key][len(prev) :]
            call = steps[k - 1].agent.call
            if endpoint == "responses":
                text, fc, out = new
                assert text["role"] == "assistant" and text["content"].startswith("w0 ")
                assert fc == {"type": "function_call", "call_id": call.id, "name": call.name,
                              "arguments": call.arguments}  # fmt: skip
                assert out["type"] == "function_call_output" and out["call_id"] == call.id
            else:
                assistant, result = new
                assert assistant["role"] == "assistant"
                text, use = assistant["content"]
                assert text["type"] == "text" and text["text"].startswith("w0 ")
                assert use == {"type": "tool_use", "id": call.id, "name": call.name,
                               "input": json.loads(call.arguments)}  # fmt: skip
                assert result["role"] == "user"
                assert result["content"][0]["tool_use_id"] == call.id
                assert entries[k]["headers"]["anthropic-version"]


def test_agent_on_an_api_without_tools_is_one_clear_error(tmp_path):
    wl = build_from_spec(SPEC, "agent", "spec", seed=0, num_requests=4)
    cfg = BenchConfig(base_url="http://127.0.0.1:9", workload=wl, endpoint="completions",
                      out_dir=tmp_path / "x", live=False)  # fmt: skip
    with pytest.raises(CbbenchError, match="chat, responses or messages"):
        run_bench(cfg, console=Console(file=io.StringIO()))


def test_agent_on_the_reference_engine_in_every_api(tmp_path):
    """The reference engine takes each API's tool shapes and renders them as chat's: the first
    step's prompt is the same number of tokens on all three; later steps (the calls and their
    results in the API's shapes) grow it; a result naming no call is the API's 400."""
    from cbbench.reference_engine.config.engine_config import EngineConfig

    from tests.server_support import serve

    wl = build_from_spec(SPEC, "agent", "spec", seed=2, num_requests=8)
    first: dict[str, list[int]] = {}
    with serve(EngineConfig(model="tiny", max_model_len=2048)) as (url, _):
        for endpoint in ("chat", "responses", "messages"):
            cfg = BenchConfig(base_url=url, workload=wl, endpoint=endpoint, concurrency=2,
                              out_dir=tmp_path / endpoint, live=False)  # fmt: skip
            res = run_bench(cfg, console=Console(file=io.StringIO(), width=200))
            assert res.summary["counts"]["completed"] == 8, [r.error for r in res.records]
            steps: dict[str, list] = {}
            for r in sorted(res.records, key=lambda r: r.turn):
                steps.setdefault(r.session_id, []).append(r.prompt_tokens_server)
            assert all(ctx == sorted(ctx) and len(set(ctx)) == len(ctx) for ctx in steps.values())
            first[endpoint] = sorted(ctx[0] for ctx in steps.values())
        bad_r = httpx.post(url + "/v1/responses", timeout=30, json={"max_output_tokens": 2,
            "input": [{"type": "function_call_output", "call_id": "c9", "output": "r"}]})  # fmt: skip
        bad_m = httpx.post(url + "/v1/messages", timeout=30, json={"max_tokens": 2, "messages": [
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "c9", "content": "r"}]}]})  # fmt: skip
    assert first["responses"] == first["chat"] == first["messages"]
    assert bad_r.status_code == 400 and "answers no earlier" in bad_r.json()["error"]["message"]
    assert bad_m.status_code == 400 and bad_m.json()["type"] == "error"
    assert "answers no earlier" in bad_m.json()["error"]["message"]


@pytest.mark.parametrize("endpoint", ["responses", "messages"])
def test_prime_sends_text_prompts_on_each_api(tmp_path, endpoint):
    """--prime on the Responses and Messages APIs sends the prefixes as text, as chat's (not
    token ids, which those APIs do not take), and agents' tool sets in the API's shapes."""
    from cbbench.harness.load.cache_options import CacheOptions
    from cbbench.reference_engine.config.engine_config import EngineConfig

    from tests.server_support import serve
    from tests.test_shared_prefix import SPEC as PREFIX_SPEC

    engine = EngineConfig(model="tiny", enable_prefix_caching=True, block_size=16)
    with serve(engine) as (url, _):
        for name, spec, kind in (("p", PREFIX_SPEC, "shared-prefix"), ("a", SPEC, "agent")):
            wl = build_from_spec(spec, kind, "spec", seed=0, num_requests=8)
            cfg = BenchConfig(base_url=url, workload=wl, endpoint=endpoint, concurrency=4,
                              out_dir=tmp_path / name, live=False,
                              cache=CacheOptions(prime=True))  # fmt: skip
            res = run_bench(cfg, console=Console(file=io.StringIO(), width=200))
            assert res.summary["counts"]["completed"] == 8, [r.error for r in res.records]
            primed = json.loads((res.run_dir / "run.json").read_text())["cache"]
            assert primed["primed_prefixes"] >= 1, primed


def test_official_clients_send_tool_turns_to_the_reference_engine():
    """The `openai` and `anthropic` clients send a tool turn in their APIs' shapes; the engine
    renders it as chat's: the same prompt tokens as the chat request of the same turn."""
    import anthropic
    import openai
    from cbbench.reference_engine.config.engine_config import EngineConfig

    from tests.server_support import serve

    with serve(EngineConfig(model="tiny", max_model_len=1024)) as (url, _):
        oai = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
        ant = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=60)
        chat = oai.chat.completions.create(model="tiny", messages=CHAT, tools=[TOOL],
                                           max_tokens=2)  # fmt: skip
        resp = oai.responses.create(model="tiny", input=input_items(CHAT), tools=[flat_tool(TOOL)],
                                    max_output_tokens=2)  # fmt: skip
        system, msgs = agent_messages(CHAT)
        msg = ant.messages.create(model="tiny", system=system, messages=msgs,
                                  tools=[anthropic_tool(TOOL)], max_tokens=2)  # fmt: skip
    assert chat.usage.prompt_tokens == resp.usage.input_tokens == msg.usage.input_tokens
