"""Agent traces: the JSONL step format (and its errors, each naming the line), native JSONL
round trips of agent workloads, and a Mooncake-format trace chained into agent sessions."""

from __future__ import annotations

import json

import pytest
from cbbench.workloads import WorkloadError, load_workload, write_native_jsonl
from cbbench.workloads.loader import build_from_spec


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


STEPS = [
    {"cbbench_agent_trace": 1},
    {"session_id": "a", "step": 1, "timestamp_s": 0.0, "input_tokens": 1200,
     "output_tokens": 30, "system_tokens": 1024, "tools": 4, "block_ids": [7, 8, 9]},
    {"session_id": "b", "step": 1, "timestamp_s": 0.5, "input_tokens": 1100, "output_tokens": 20},
    {"session_id": "a", "step": 2, "timestamp_s": 2.0, "input_tokens": 1500,
     "output_tokens": 25, "tool_latency_s": 1.25},
    {"session_id": "a", "step": 3, "timestamp_s": 4.0, "input_tokens": 1700, "output_tokens": 90},
]  # fmt: skip


def test_agent_trace_steps_become_agent_sessions(tmp_path):
    wl = load_workload(_write(tmp_path / "t.jsonl", STEPS))
    a = [r for r in wl.requests if r.session_id == "a"]
    assert [r.turn for r in a] == [1, 2, 3]
    assert [r.prompt_len for r in a] == [1200 - 1024, 1500 - 1230, 1700 - 1525]
    assert [r.output_len for r in a] == [30, 25, 90]
    assert a[0].prefix_ids == (7, 8) and a[0].agent.system_len == 1024
    assert len(json.loads(a[0].agent.tools)) == 4
    assert a[1].think_s == 1.25 and a[2].think_s == 2.0  # latency given, else the gap
    assert a[1].agent.answers == a[0].agent.call.id and a[2].agent.answers == a[1].agent.call.id
    assert a[2].agent.call is None  # the last step: the final answer
    b = [r for r in wl.requests if r.session_id == "b"]
    assert len(b) == 1 and b[0].agent.call is None and b[0].agent.tools == ""


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        (STEPS[:2] + [dict(STEPS[3], step=3)], r"t.jsonl:3: session 'a': step 3 after step 1 "
                                               r"\(steps out of order\)"),
        ([STEPS[3]], r"t.jsonl:1: session 'a' starts at step 2, not 1"),
        (STEPS[:2] + [dict(STEPS[3], input_tokens=1000)], r"t.jsonl:3: .*the context shrank"),
        (STEPS[:2] + [dict(STEPS[3], timestamp_s=-1)], r"t.jsonl:3: 'timestamp_s' must be >= 0"),
        ([dict(STEPS[1], tool="x")], r"t.jsonl:1: unknown key 'tool'"),
        ([dict(STEPS[1], output_tokens=None)], r"t.jsonl:1: 'output_tokens' must be a number"),
    ],
)  # fmt: skip
def test_agent_trace_errors_name_the_line(tmp_path, rows, match):
    with pytest.raises(WorkloadError, match=match):
        load_workload(_write(tmp_path / "t.jsonl", rows))


def test_native_jsonl_round_trips_agent_steps(tmp_path):
    wl = build_from_spec({"agent": {"steps": 4}}, "agent", "spec", seed=5, num_requests=9)
    write_native_jsonl(wl, tmp_path / "w.jsonl")
    back = load_workload(str(tmp_path / "w.jsonl"))
    assert back.requests == wl.requests


def test_native_tool_result_without_its_call_id_is_refused(tmp_path):
    wl = build_from_spec({"agent": {"steps": 3}}, "agent", "spec", seed=5, num_requests=3)
    write_native_jsonl(wl, tmp_path / "w.jsonl")
    lines = (tmp_path / "w.jsonl").read_text().splitlines()
    row = json.loads(lines[2])
    row["agent"]["answers"] = None
    lines[2] = json.dumps(row)
    (tmp_path / "w.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(WorkloadError, match=r"w.jsonl:3: agent step 2 is a tool result without"):
        load_workload(str(tmp_path / "w.jsonl"))


def test_mooncake_format_chained_into_agent_steps(tmp_path):
    rows = [  # one conversation of 3 requests (each extends the last's blocks), one alone
        {"timestamp": 0, "input_length": 1100, "output_length": 10, "hash_ids": [1, 2, 3]},
        {"timestamp": 500, "input_length": 900, "output_length": 5, "hash_ids": [9, 10]},
        {"timestamp": 2000, "input_length": 1600, "output_length": 12, "hash_ids": [1, 2, 4, 5]},
        {"timestamp": 4000, "input_length": 2100, "output_length": 30,
         "hash_ids": [1, 2, 4, 5, 6]},
    ]  # fmt: skip
    path = _write(tmp_path / "tool.jsonl", rows)
    spec = {"trace": {"path": path, "format": "mooncake", "sessions": True, "agent": True}}
    wl = build_from_spec(spec, "toolagent", "spec")
    chain = sorted((r for r in wl.requests if r.session_id == "m0"), key=lambda r: r.turn)
    assert [r.turn for r in chain] == [1, 2, 3]
    assert [r.agent.call is None for r in chain] == [False, False, True]
    assert chain[1].agent.answers == chain[0].agent.call.id
    with pytest.raises(WorkloadError, match="'agent' turns chained Mooncake sessions"):
        build_from_spec({"trace": {"path": path, "agent": True}}, "x", "spec")


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"agent": {"step": 3}}, r"spec: agent: unknown key 'step'"),
        ({"agent": {"tool_sets": 0}}, r"'tool_sets' must be an integer >= 1"),
        ({"agent": {"steps": {"dist": "nope"}}}, r"agent: steps: unknown dist 'nope'"),
        ({"agent": {"system": 300000}}, r"system prompt of 300000 tokens is over"),
        ({"agent": {}, "prompt": 5}, r"'prompt' cannot be combined with 'agent'"),
        ({"shared_prefix": {"groups": 2}}, r"shared_prefix: 'prompts_per_group' must be an integer"),
    ],
)  # fmt: skip
def test_generator_tables_refuse_bad_keys(spec, match):
    with pytest.raises(WorkloadError, match=match):
        build_from_spec(spec, "x", "spec", num_requests=4)
