"""Agent sessions end to end. Against a recording OpenAI-compatible server (a real HTTP server
on 127.0.0.1 that logs every request it receives, and when): every later step resends the
history with the assistant's `tool_calls` and the `tool` result naming the call, the `tools`
list goes with every request, the session id header with every request of the session, and
the gaps between a reply and the next step follow the tool latencies. Against the reference
engine: the context grows step by step, prefix caching serves it, bad tool messages are a
400, and a session that outgrows the context fails by name."""

from __future__ import annotations

import io
import json

import httpx
import pytest
from cbbench.harness.diagnose import diagnose_run
from cbbench.harness.errors import CbbenchError
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.results.run_folder import load_run
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.server.runner import ThreadedServer
from cbbench.workloads.loader import build_from_spec
from rich.console import Console

from tests.recording_server import recording_app
from tests.server_support import serve

SPEC = {
    "agent": {
        "steps": {"dist": "uniform", "min": 3, "max": 6},
        "system": 64,
        "tools": 3,
        "tool_tokens": 30,
        "task": 20,
        "call": 4,
        "answer": 6,
        "result": {"dist": "uniform", "min": 10, "max": 40},
        "tool_ms": {"dist": "uniform", "min": 40, "max": 300},
    }
}


def _bench(url: str, wl, tmp_path, folder: str, **kw) -> object:
    cfg = BenchConfig(
        base_url=url, workload=wl, endpoint="chat", out_dir=tmp_path / folder, live=False, **kw
    )
    return run_bench(cfg, console=Console(file=io.StringIO(), width=200))


def test_agent_workload_is_deterministic_and_chained():
    a = build_from_spec(SPEC, "agent", "spec", seed=3, num_requests=40).requests
    b = build_from_spec(SPEC, "agent", "spec", seed=3, num_requests=40).requests
    assert a == b
    sessions: dict[str, list] = {}
    for r in a:
        sessions.setdefault(r.session_id, []).append(r)
    for steps in sessions.values():
        assert [s.turn for s in steps] == list(range(1, len(steps) + 1))
        assert steps[-1].agent.call is None  # a final answer ends every session
        assert all(s.agent.call is not None for s in steps[:-1])
        for prev, nxt in zip(steps, steps[1:], strict=False):
            assert nxt.agent.answers == prev.agent.call.id
            assert 0.04 <= nxt.think_s <= 0.3
        assert steps[0].prefix_ids and not steps[1].prefix_ids


def test_agent_bench_sends_the_chat_api_tool_loop(tmp_path):
    wl = build_from_spec(SPEC, "agent", "spec", seed=1, num_requests=18)
    log: list[dict] = []
    with ThreadedServer(recording_app(log)) as url:
        res = _bench(url, wl, tmp_path, "rec", concurrency=2)
    assert res.summary["counts"]["completed"] == 18
    by_session: dict[str, list[dict]] = {}
    for e in log:
        by_session.setdefault(e["headers"]["x-session-id"], []).append(e)
    specs = {
        r.session_id: [q for q in wl.requests if q.session_id == r.session_id] for r in wl.requests
    }
    assert set(by_session) == set(specs)
    for sid, entries in by_session.items():
        steps = specs[sid]
        assert len(entries) == len(steps)
        tools = entries[0]["body"]["tools"]
        assert [t["function"]["name"] for t in tools] == ["tool_0", "tool_1", "tool_2"]
        first = entries[0]["body"]["messages"]
        assert [m["role"] for m in first] == ["system", "user"]
        for k in range(1, len(entries)):
            prev, cur = entries[k - 1]["body"]["messages"], entries[k]["body"]
            assert cur["tools"] == tools  # the tools list on every request
            msgs = cur["messages"]
            assert msgs[: len(prev)] == prev  # the whole history, unchanged
            assistant, tool = msgs[len(prev)], msgs[len(prev) + 1]
            assert len(msgs) == len(prev) + 2
            call = steps[k - 1].agent.call
            assert assistant["role"] == "assistant"
            assert assistant["tool_calls"] == [
                {"id": call.id, "type": "function",
                 "function": {"name": call.name, "arguments": call.arguments}}
            ]  # fmt: skip
            assert assistant["content"].startswith("w0 ")  # the server's own reply text
            assert tool == {"role": "tool", "tool_call_id": call.id, "content": tool["content"]}
            # the tool wait, from the server's clock: its reply ended -> the next step came
            gap = entries[k]["t_in"] - entries[k - 1]["t_out"]
            assert gap >= steps[k].think_s - 0.005, (gap, steps[k].think_s)
            assert gap < steps[k].think_s + 0.5, (gap, steps[k].think_s)  # loaded 2-core box
    recs = {(r.session_id, r.turn): r for r in res.records}
    waits = [(recs[(q.session_id, q.turn)].extra["tool_wait_s"], q.think_s)
             for q in wl.requests if q.turn > 1]  # fmt: skip
    assert all(w >= t - 0.005 for w, t in waits)
    ag = res.summary["agent"]
    assert ag["sessions"] == len(by_session) and ag["steps"] == 18
    assert ag["tool_wait_s"]["count"] == len(waits)
    assert ag["makespan_s"]["count"] == ag["sessions_finished"] >= 1
    for q in wl.requests:  # the tool wait ends before the step is ready: never in its latency
        if q.turn > 1:
            prev, cur = recs[(q.session_id, q.turn - 1)], recs[(q.session_id, q.turn)]
            assert cur.ready_s >= prev.end_s + q.think_s - 0.005
            assert cur.sent_s >= cur.ready_s and cur.ttft_s < cur.first_token_s - prev.end_s


def test_agent_needs_the_chat_endpoint(tmp_path):
    wl = build_from_spec(SPEC, "agent", "spec", seed=0, num_requests=4)
    cfg = BenchConfig(
        base_url="http://127.0.0.1:9", workload=wl, out_dir=tmp_path / "x", live=False
    )
    with pytest.raises(CbbenchError, match="agent sessions need --endpoint chat"):
        run_bench(cfg, console=Console(file=io.StringIO()))


def test_agent_on_the_reference_engine(tmp_path):
    wl = build_from_spec(SPEC, "agent", "spec", seed=2, num_requests=12)
    with serve(EngineConfig(model="tiny", enable_prefix_caching=True, block_size=16)) as (url, _):
        res = _bench(url, wl, tmp_path, "ref", concurrency=2)
        bad = httpx.post(
            url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"},
                               {"role": "tool", "content": "result"}], "max_tokens": 2},
            timeout=30,
        )  # fmt: skip
        unknown = httpx.post(
            url + "/v1/chat/completions",
            json={"messages": [{"role": "tool", "tool_call_id": "c9", "content": "r"}]},
            timeout=30,
        )
    assert res.summary["counts"]["completed"] == 12
    steps: dict[str, list] = {}
    for r in sorted(res.records, key=lambda r: r.turn):
        steps.setdefault(r.session_id, []).append(r)
    for recs in steps.values():
        ctx = [r.prompt_tokens_server for r in recs]
        assert ctx == sorted(ctx) and len(set(ctx)) == len(ctx)  # the context only grows
    later = [r for r in res.records if r.turn > 1]
    assert sum(r.extra["num_cached_tokens"] for r in later) > 0.5 * sum(
        r.prompt_tokens_server for r in later
    )
    assert res.summary["agent"]["prefix_cache_hit_rate"] > 0.5
    rules = [f.rule for f in diagnose_run(load_run(res.run_dir)).findings]
    assert "agent-cache" not in rules and "session-cache" not in rules  # the cache served it
    assert bad.status_code == 400
    err = bad.json()["error"]
    assert err["param"] == "messages.1.tool_call_id" and "needs the tool_call_id" in err["message"]
    assert unknown.status_code == 400 and "answers no earlier" in unknown.json()["error"]["message"]


def test_agent_session_longer_than_the_context_is_cut_before_it_is_sent(tmp_path):
    """Issue 51 #16: the step that would outgrow the server's max_model_len (the tools list
    counted by the server's /tokenize) and the rest of its session are not sent; the run
    counts them, and no request fails for its length."""
    spec = {"agent": dict(SPEC["agent"], steps=8, result=400, tool_ms=1)}
    wl = build_from_spec(spec, "agent", "spec", seed=0, num_requests=8)
    with serve(EngineConfig(model="tiny", max_model_len=1024)) as (url, _):
        res = _bench(url, wl, tmp_path, "long", concurrency=1)
    assert all(r.ok for r in res.records), [r.error for r in res.records]
    fit = res.meta["load"]["context_fit"]
    assert fit["sessions_cut"] == 1 and fit["skipped"] == 8 - len(res.records) > 0, fit


def test_agent_makespan_in_report_and_gate(tmp_path):
    from cbbench.harness.gate.judge import run_gate
    from cbbench.harness.gate.policy import Policy, Rule
    from cbbench.harness.report import build_report
    from cbbench.harness.results.run_folder import load_run

    fast = {"agent": dict(SPEC["agent"], steps=3, tool_ms=20)}
    slow = {"agent": dict(SPEC["agent"], steps=3, tool_ms=200)}
    dirs = []
    with ThreadedServer(recording_app([])) as url:
        for name, spec in (("fast", fast), ("slow", slow)):
            wl = build_from_spec(spec, "agent", "spec", seed=1, num_requests=36)
            dirs.append(_bench(url, wl, tmp_path, name, concurrency=12, name=name).run_dir)
    report = build_report(dirs)
    md = report.markdown()
    assert "<h2" in (html := report.html()) and "Agent sessions" in html and "makespan p50" in html
    assert "Agent sessions (tool waits are never inside a latency):" in md
    assert md.count("| fast") + md.count("| slow") >= 4  # the summary and the agent rows
    policy = Policy(rules=(Rule("makespan", "max_increase", 0.5, "p50"),), min_requests=5)
    base, cand = load_run(dirs[0]), load_run(dirs[1])
    assert run_gate(base, base, policy).passed
    result = run_gate(base, cand, policy)  # tool waits 10x longer: the makespan grows
    assert result.results[0].verdict == "fail" and result.results[0].estimate > 3, result


def test_agent_sessions_through_locust(tmp_path):
    """`cbbench locust` users run agent sessions with the same messages as bench: every later
    step carries the call and its tool result, the tools list and the session header."""
    import subprocess
    import sys

    spec = tmp_path / "agent.json"
    spec.write_text(json.dumps({**SPEC, "num_requests": 8}), encoding="utf-8")
    wl = build_from_spec(SPEC, "agent", "spec", seed=0, num_requests=8)
    log: list[dict] = []
    with ThreadedServer(recording_app(log)) as url:
        cmd = [sys.executable, "-m", "cbbench.harness.cli", "locust", "--base-url", url]
        cmd += ["--workload", str(spec), "--out", str(tmp_path / "locust"), "--no-gpu-metrics"]
        cmd += ["--headless", "-r", "100", "-u", "2", "-t", "40s", "--endpoint", "chat"]
        cmd += ["--web-port", "0", "--no-server-metrics"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(log) == 8
    run = load_run(tmp_path / "locust")
    recs = run.records
    agent = run.meta["summary"]["agent"]
    assert agent["steps"] == 8 and agent["tool_wait_s"]["count"] == 8 - agent["sessions"]
    waits = {(r.session_id, r.turn): r.extra.get("tool_wait_s") for r in recs}
    for q in wl.requests:
        if q.turn > 1:
            assert waits[(q.session_id, q.turn)] >= q.think_s - 0.005
    steps = {(q.session_id, q.turn): q for q in wl.requests}
    for e in log:
        sid, msgs = e["headers"]["x-session-id"], e["body"]["messages"]
        turn = sum(m["role"] == "tool" for m in msgs) + 1
        assert e["body"]["tools"] and msgs[0]["role"] == "system"
        if turn > 1:
            call = steps[(sid, turn - 1)].agent.call
            assert msgs[-2]["tool_calls"][0]["id"] == call.id
            assert msgs[-1] == {
                "role": "tool",
                "tool_call_id": call.id,
                "content": msgs[-1]["content"],
            }
