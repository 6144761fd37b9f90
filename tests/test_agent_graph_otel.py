"""OpenTelemetry GenAI traces replayed as agent graphs, against a recording server on 127.0.0.1
whose answers ("w0 w1 ...") differ from the recorded text: every LLM span is sent once, no
call starts before all its predecessors have ended (on the server's clock), calls whose
predecessors ended together run concurrently, and later calls' assistant turns carry what the
server answered. Malformed traces end in one line naming the span and the fault.
(Fixtures: tests/fixtures/otel/, written by its make_fixtures.py: a chain in the OTLP JSON
export, a fan-out in the flat `spans` layout, a fan-in with a temporal edge.)"""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import pytest
from cbbench.harness.cli import main
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.results.run_folder import load_run
from cbbench.reference_engine.server.runner import ThreadedServer
from cbbench.workloads.errors import WorkloadError
from cbbench.workloads.loader import load_workload
from rich.console import Console

from tests.recording_server import recording_app

FIXTURES = Path(__file__).parent / "fixtures" / "otel"
TOKEN_DELAY_S = 0.02  # a call of n tokens takes >= n x 20 ms: concurrent calls overlap


def _answer(n: int) -> str:
    return "".join(f"w{i} " for i in range(n))  # what the recording server streams


def _expected_messages(wl) -> dict[int, list[dict]]:
    """Each call's messages as they must arrive: recorded, live turns replaced."""
    by_index = {r.index: r for r in wl.requests}
    out = {}
    for r in wl.requests:
        msgs = json.loads(r.graph.messages)
        for pos, src in r.graph.live:
            msgs[pos] = {**msgs[pos], "content": _answer(by_index[src].output_len)}
        out[r.index] = msgs
    return out


def test_the_graphs_are_inferred_from_the_spans():
    chain = load_workload(str(FIXTURES / "chain.json"))
    assert [r.graph.after for r in chain.requests] == [(), (0,), (1,)]  # reduced: not (0, 1)
    assert chain.requests[2].graph.live == ((2, 0), (4, 1))  # both earlier answers spliced
    assert [r.think_s for r in chain.requests] == [None, 0.5, 0.7]  # the tool's 0.5 s kept
    assert chain.source["rows_skipped"] == {
        "not an LLM call (execute_tool)": 1,
        "not an LLM call (invoke_agent)": 1,
    }
    tools = json.loads(chain.requests[0].graph.tools)
    assert tools[0]["function"]["name"] == "get_weather"  # gen_ai.tool.definitions
    msgs = json.loads(chain.requests[1].graph.messages)
    assert msgs[2]["tool_calls"][0]["id"] == "call_w1" and msgs[3]["role"] == "tool"
    fan = load_workload(str(FIXTURES / "fanout.json"))
    assert [r.graph.after for r in fan.requests] == [(), (0,), (0,), (0,)]
    assert [r.output_len for r in fan.requests] == [15, 11, 12, 13]  # gen_ai.usage.output_tokens
    fanin = load_workload(str(FIXTURES / "fanin.json"))
    assert [r.graph.after for r in fanin.requests] == [(), (), (0, 1), (2,)]  # the last: temporal
    assert fanin.requests[2].think_s == pytest.approx(0.5)  # after the later of the two


def test_otel_replay_sends_every_span_once_in_graph_order_with_live_answers(tmp_path):
    wl = load_workload(str(FIXTURES))  # the folder: three traces, three sessions
    assert len({r.session_id for r in wl.requests}) == 3
    log: list[dict] = []
    with ThreadedServer(recording_app(log, TOKEN_DELAY_S)) as url:
        cfg = BenchConfig(
            base_url=url, workload=wl, endpoint="chat", out_dir=tmp_path / "run", live=False,
            concurrency=8,
        )  # fmt: skip
        err = io.StringIO()
        res = run_bench(cfg, console=Console(file=err, width=300))
    assert "counts calls in flight" in err.getvalue()
    assert res.summary["counts"]["completed"] == len(wl.requests) == 11
    expected = _expected_messages(wl)
    seen: dict[int, dict] = {}
    for e in log:
        match = [i for i, m in expected.items() if m == e["body"]["messages"]]
        assert len(match) == 1, e["body"]["messages"]  # live answers, not the recorded text
        assert match[0] not in seen  # every LLM span sent once
        seen[match[0]] = e
    assert set(seen) == set(expected)
    by_index = {r.index: r for r in wl.requests}
    for i, e in seen.items():
        r = by_index[i]
        assert e["headers"]["x-session-id"] == r.session_id
        assert e["body"]["max_tokens"] == r.output_len
        if r.graph.tools:
            assert e["body"]["tools"] == json.loads(r.graph.tools)
        for p in r.graph.after:  # never before a predecessor ended, and after its wait
            assert e["t_in"] >= seen[p]["t_out"] + (r.think_s or 0.0) - 0.005
    fan = [i for i, r in by_index.items() if r.session_id == "fan-out-1" and r.graph.after]
    assert len(fan) == 3  # the sub-agents, whose one predecessor ended once: together
    for a in fan:
        for b in fan:
            assert seen[a]["t_in"] < seen[b]["t_out"]  # their server intervals overlap
    roots = [
        i for i, r in by_index.items() if r.session_id.startswith("fa11") and not r.graph.after
    ]
    assert seen[roots[0]]["t_in"] < seen[roots[1]]["t_out"]  # the fan-in's two roots overlap
    graph = load_run(res.run_dir).meta["summary"]["graph"]  # in run.json
    assert graph["sessions"] == 3 and graph["sessions_succeeded"] == 3
    assert graph["session_success"] == 1.0
    assert graph["calls_per_session"]["max"] == 4 and graph["fan_out_width"]["max"] == 3


def _write(tmp_path: Path, name: str, obj: dict) -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return p


def _fanout() -> dict:
    return json.loads((FIXTURES / "fanout.json").read_text())


def _one_line_error(capsys, path: Path) -> str:
    rc = main(["workload", "show", str(path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "Traceback" not in err, err
    return err


def test_malformed_traces_end_in_one_line_naming_span_and_fault(tmp_path, capsys):
    no_msgs = _fanout()
    del no_msgs["spans"][2]["attributes"]["gen_ai.input.messages"]
    err = _one_line_error(capsys, _write(tmp_path, "nomsg.json", no_msgs))
    assert "span sub2" in err and "without input messages" in err
    bad_time = _fanout()
    bad_time["spans"][1]["end_time"] = "2026-01-05T11:59:00Z"  # before its start
    err = _one_line_error(capsys, _write(tmp_path, "time.json", bad_time))
    assert "span sub1: bad timestamps" in err and "before it starts" in err
    unreadable = _fanout()
    unreadable["spans"][0]["start_time"] = "yesterday"
    err = _one_line_error(capsys, _write(tmp_path, "time2.json", unreadable))
    assert "span orch: bad timestamps: start time 'yesterday'" in err
    cycle = _fanout()  # orch links to sub1, which quotes orch's answer: a cycle
    cycle["spans"][0]["links"] = [{"trace_id": "fan-out-1", "span_id": "sub1"}]
    err = _one_line_error(capsys, _write(tmp_path, "cycle.json", cycle))
    assert "a cycle in the call graph" in err and ("span orch" in err or "span sub1" in err)
    with pytest.raises(WorkloadError, match="no LLM spans"):
        only_tools = copy.deepcopy(_fanout())
        only_tools["spans"] = [s for s in only_tools["spans"] if s["span_id"] == "tool9"]
        load_workload(str(_write(tmp_path, "tools.json", only_tools)))


def test_workload_show_prints_the_graph(capsys):
    assert main(["workload", "show", str(FIXTURES), "--json"]) == 0
    shape = json.loads(capsys.readouterr().out)["graph"]
    assert shape == {"sessions": 3, "calls": 11, "depth_max": 3, "fan_out_max": 3, "live_turns": 8}
    assert main(["workload", "show", str(FIXTURES / "fanin.json")]) == 0
    out = capsys.readouterr().out
    assert "call graph: 1 sessions" in out
    assert "f000000000000003" in out and "after f000000000000001, f000000000000002" in out
    assert main(["workload", "show", str(FIXTURES / "chain.json")]) == 0
    out = capsys.readouterr().out  # what was skipped, and why
    assert "rows skipped: not an LLM call (execute_tool) 1, not an LLM call (invoke_agent) 1" in out


def test_openinference_spans_convert_into_the_same_graph(tmp_path):
    """Arize OpenInference's flattened attributes (Phoenix, its instrumentors)."""

    def span(sid, a, b, kind, msgs=(), out=None):
        attrs = {"openinference.span.kind": kind}
        for i, (role, content) in enumerate(msgs):
            attrs[f"llm.input_messages.{i}.message.role"] = role
            attrs[f"llm.input_messages.{i}.message.content"] = content
        if out is not None:
            attrs["llm.output_messages.0.message.role"] = "assistant"
            attrs["llm.output_messages.0.message.content"] = out
            attrs["llm.token_count.completion"] = 4
        return {"span_id": sid, "trace_id": "oi", "name": kind.lower(), "start_time": a,
                "end_time": b, "attributes": attrs}  # fmt: skip

    spans = [
        span("q1", 1.0, 2.0, "LLM", [("user", "find flights")], "calling search"),
        span("t1", 2.0, 2.4, "TOOL"),
        span("q2", 2.5, 3.0, "LLM",
             [("user", "find flights"), ("assistant", "calling search"), ("user", "3 found")],
             "pick the first"),
    ]  # fmt: skip
    multimodal = spans[2]["attributes"]  # the answer quoted as a text part
    del multimodal["llm.input_messages.1.message.content"]
    multimodal["llm.input_messages.1.message.contents.0.message_content.type"] = "text"
    multimodal["llm.input_messages.1.message.contents.0.message_content.text"] = "calling search"
    wl = load_workload(str(_write(tmp_path, "oi.json", {"spans": spans})))
    assert [r.graph.after for r in wl.requests] == [(), (0,)]
    assert wl.requests[1].graph.live == ((1, 0),) and wl.requests[1].output_len == 4
    assert wl.requests[1].think_s == pytest.approx(0.5)
    assert wl.source["rows_skipped"] == {"not an LLM call (tool)": 1}


def test_graph_workloads_round_trip_native_jsonl(tmp_path):
    from cbbench.workloads.native import write_native_jsonl

    for src in (str(FIXTURES), "agent-graph"):
        wl = load_workload(src, num_requests=30)
        write_native_jsonl(wl, tmp_path / "w.jsonl")
        assert load_workload(str(tmp_path / "w.jsonl")).requests == wl.requests


def test_call_slots_serve_running_sessions_before_new_ones():
    import asyncio

    from cbbench.harness.load.graph import CallSlots

    async def scenario() -> list[str]:
        slots, order = CallSlots(1), []
        await slots.acquire()  # the one slot is busy

        async def take(name: str, start: bool) -> None:
            await slots.acquire(start=start)
            order.append(name)
            slots.release()

        new = asyncio.ensure_future(take("new session", True))
        await asyncio.sleep(0)
        call = asyncio.ensure_future(take("running session's call", False))
        gone = asyncio.ensure_future(take("cancelled", False))
        await asyncio.sleep(0)
        gone.cancel()
        slots.release()
        await asyncio.wait_for(asyncio.gather(new, call, return_exceptions=True), 5)
        assert slots.free == 1 and not any(slots.waiting)  # the cancelled waiter left no trace
        return order

    assert asyncio.run(scenario()) == ["running session's call", "new session"]


def test_bench_cli_replays_a_trace_file_and_refuses_a_bad_one(tmp_path, capsys):
    log: list[dict] = []
    with ThreadedServer(recording_app(log)) as url:
        argv = ["bench", "--base-url", url, "--endpoint", "chat", "--concurrency", "2"]
        rc = main([*argv, "--workload", str(FIXTURES / "chain.json"), "--out", str(tmp_path / "r")])
        out = capsys.readouterr()
        assert rc == 0, out.err
        assert "agent graphs: 1/1 sessions succeeded" in out.out
        assert "counts calls in flight" in out.err
        bad = _fanout()
        bad["spans"][3]["start_time"] = None
        path = _write(tmp_path, "bad.json", bad)
        assert main([*argv, "--workload", str(path), "--out", str(tmp_path / "b")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "span sub3: bad timestamps: start time None" in err
    assert len(log) == 3


def test_a_spec_file_times_trace_sessions_by_an_arrival_process(tmp_path):
    spec = tmp_path / "otel.toml"
    spec.write_text(
        f'trace = {{path = "{FIXTURES}"}}\narrival = {{kind = "poisson", rate = 2.0}}\n'
    )
    wl = load_workload(str(spec), seed=1)
    firsts = [r for r in wl.requests if r.turn == 1]
    assert len(firsts) == 3 and all(r.arrival_s is not None for r in firsts)
    assert all(r.arrival_s is None for r in wl.requests if r.turn != 1)  # they follow the graph
    assert [r.graph.after for r in wl.requests] == [
        r.graph.after for r in load_workload(str(FIXTURES)).requests
    ]


def test_collector_jsonl_and_the_details_event_read_as_the_same_chain(tmp_path):
    """The collector's file exporter writes one OTLP object a line; newer instrumentations may
    put the messages on a `gen_ai.client.inference.operation.details` span event."""
    chain = json.loads((FIXTURES / "chain.json").read_text())
    spans = chain["resourceSpans"][0]["scopeSpans"][0]["spans"]
    second = spans[3]  # c000000000000002: its messages on the event instead
    moved = [a for a in second["attributes"] if a["key"].startswith("gen_ai.input")]
    second["attributes"] = [a for a in second["attributes"] if a not in moved]
    second["events"] = [{"name": "gen_ai.client.inference.operation.details", "attributes": moved}]
    lines = []
    for part in (spans[:3], spans[3:]):
        obj = copy.deepcopy(chain)
        obj["resourceSpans"][0]["scopeSpans"][0]["spans"] = part
        lines.append(json.dumps(obj))
    path = tmp_path / "export.jsonl"
    path.write_text("\n".join(lines) + "\n")
    got, want = (
        load_workload(str(path)).requests,
        load_workload(str(FIXTURES / "chain.json")).requests,
    )
    assert [(r.graph.after, r.graph.live, r.graph.messages, r.think_s) for r in got] == [
        (r.graph.after, r.graph.live, r.graph.messages, r.think_s) for r in want
    ]


def test_a_quote_of_a_later_calls_answer_is_no_edge(tmp_path):
    """The orchestrator's input holds text equal to a sub-agent's later answer (a repeated
    phrase): a call that started later cannot have written it, so no edge and no cycle."""
    trace = _fanout()
    trace["spans"][0]["attributes"]["gen_ai.input.messages"] = json.dumps(
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "step 1 done: findings 1"},
        ]
    )
    wl = load_workload(str(_write(tmp_path, "quote.json", trace)))
    assert [r.graph.after for r in wl.requests] == [(), (0,), (0,), (0,)]
    assert wl.requests[0].graph.live == ()
