"""The `agent-graph` workload end to end: against the reference engine (`cbbench serve --model
tiny`'s stack on 127.0.0.1) with session metrics in the summary, the report (a table and a
Gantt chart), the gate (`session_success`, `makespan`) and diagnose; through `cbbench route
--policy session-affinity` to two recording replicas, which see the session header on every
call and get each session whole; and the `fanout-queue` rule against a server that answers
one call at a time (siblings queue) and one that answers them together (silent)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from cbbench.harness.cli import main
from cbbench.harness.diagnose import diagnose_run
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.results.run_folder import load_run
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.router.serve import RouterOptions, RouterThread
from cbbench.reference_engine.server.runner import ThreadedServer
from cbbench.workloads.loader import build_from_spec, load_workload
from rich.console import Console

from tests.recording_server import recording_app
from tests.server_support import serve

SMALL = Path(__file__).parent.parent / "docs" / "specs" / "agent-graph-small.toml"
FAN = {  # fan-outs of 3-4 one-step sub-agents, short outputs, no tool waits
    "agent_graph": {
        "fan_out": {"dist": "uniform", "min": 3, "max": 4},
        "depth": 1, "system": 8, "tools": 1, "task": 8, "plan": 4, "subtask": 4, "step": 6,
        "result": 4, "answer": 4, "tool_ms": 0,
    }
}  # fmt: skip


def _bench(url: str, wl, out: Path, concurrency: int = 4):
    cfg = BenchConfig(
        base_url=url, workload=wl, endpoint="chat", out_dir=out, live=False,
        concurrency=concurrency,
    )  # fmt: skip
    text = io.StringIO()
    res = run_bench(cfg, console=Console(file=text, width=250))
    return res, text.getvalue()


def test_agent_graph_preset_is_a_fan_out_fan_in():
    wl = load_workload("agent-graph", seed=1, num_requests=60)
    assert wl == load_workload("agent-graph", seed=1, num_requests=60)  # deterministic
    sessions: dict[str, list] = {}
    for r in wl.requests:
        sessions.setdefault(r.session_id, []).append(r)
    for calls in list(sessions.values())[:-1]:  # the last may be cut at 60
        orch, reducer = calls[0], calls[-1]
        assert orch.graph.after == () and reducer.graph.name == "reducer"
        subs = [c for c in calls if c.graph.after == (orch.index,)]
        assert 2 <= len(subs) <= 6  # K uniform 2-6
        assert len(reducer.graph.after) == len(subs)  # one final step per sub-agent
        assert all(c.graph.calls == len(calls) for c in calls)
        assert {src for _, src in reducer.graph.live} == {orch.index, *reducer.graph.after}


def test_agent_graph_on_the_reference_engine(tmp_path, capsys):
    wl = load_workload(str(SMALL))
    with serve(EngineConfig(model="tiny", enable_prefix_caching=True, block_size=16)) as (url, _):
        res, printed = _bench(url, wl, tmp_path / "run")
    assert res.summary["counts"]["completed"] == len(wl.requests)
    g = res.summary["graph"]
    n_sessions = len({r.session_id for r in wl.requests})
    assert g["sessions"] == g["sessions_succeeded"] == n_sessions and g["session_success"] == 1.0
    assert g["fan_out_width"]["max"] >= 2 and g["makespan_s"]["count"] == n_sessions
    assert g["makespan_s"]["p50"] >= g["critical_path_server_s"]["p50"] > 0
    assert set(g["by_step"]) >= {"1", "2", "3"} and g["prefix_cache_hit_rate"] > 0
    assert "agent graphs: " in printed and "critical path" in printed
    md, html = tmp_path / "r.md", tmp_path / "r.html"
    assert main(["report", str(tmp_path / "run"), "-o", str(html), "--markdown", str(md)]) == 0
    assert "Agent graph sessions" in md.read_text()
    page = html.read_text()
    assert "agent graph sessions (Gantt)" in page
    assert page.count("seconds from the session start") == 1
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[[rules]]\nmetric = "session_success"\nmin = 1\n'
        '[[rules]]\nmetric = "makespan"\nstat = "p50"\nmax_increase = 10\n'
    )
    run = str(tmp_path / "run")
    assert main(["gate", "--baseline", run, "--candidate", run, "--policy-file", str(policy)]) == 0, (
        capsys.readouterr().out
    )
    out = capsys.readouterr().out
    assert "session success" in out and "makespan" in out


def test_agent_graph_through_the_session_affinity_router(tmp_path):
    wl = build_from_spec(FAN, "fan", "spec", seed=2, num_requests=30)
    logs: list[list[dict]] = [[], []]
    with (
        ThreadedServer(recording_app(logs[0])) as u1,
        ThreadedServer(recording_app(logs[1])) as u2,
        RouterThread(RouterOptions([u1, u2], policy="session-affinity", port=0)) as url,
    ):
        res, _ = _bench(url, wl, tmp_path / "run", concurrency=6)
    assert res.summary["counts"]["completed"] == 30
    assert sum(len(log) for log in logs) == 30
    where: dict[str, set[int]] = {}
    for i, log in enumerate(logs):
        for e in log:
            where.setdefault(e["headers"]["x-session-id"], set()).add(i)  # on every call
    assert set(where) == {r.session_id for r in wl.requests}
    assert all(len(r) == 1 for r in where.values()), where  # a session stays on one replica
    assert {i for r in where.values() for i in r} == {0, 1}
    assert res.summary["graph"]["session_success"] == 1.0
    md = tmp_path / "r.md"
    assert main(["report", str(tmp_path / "run"), "--markdown", str(md), "--no-html"]) == 0
    assert "Agent graph sessions" in md.read_text()


def test_fanout_queue_rule_fires_when_siblings_wait_for_each_other(tmp_path):
    spaced = {**FAN, "arrival": {"kind": "constant", "rate": 4}}  # sessions 250 ms apart
    wl = build_from_spec(spaced, "fan", "spec", seed=3, num_requests=30)
    runs = {}
    for name, serial in (("serial", True), ("parallel", False)):
        log: list[dict] = []
        with ThreadedServer(recording_app(log, 0.005, serial=serial)) as url:
            _bench(url, wl, tmp_path / name, concurrency=8)
        runs[name] = diagnose_run(load_run(tmp_path / name))
    fired = {f.rule: f for f in runs["serial"].findings}
    assert "fanout-queue" in fired, [f.rule for f in runs["serial"].findings]
    f = fired["fanout-queue"]
    assert f.values["ttft_last_p50_s"] >= 2 * f.values["ttft_first_p50_s"]
    assert "the server queued them" in " ".join(f.evidence)
    assert "fanout-queue" not in {f.rule for f in runs["parallel"].findings}
    firsts = [r for r in load_run(tmp_path / "parallel").records if r.turn == 1]
    arrivals = sorted(r.arrival_s for r in wl.requests if r.turn == 1)
    assert sorted(r.scheduled_s for r in firsts) == arrivals  # sessions arrive by the process
    assert all(r.sent_s >= r.scheduled_s for r in firsts)
    assert json.dumps(f.to_dict())


def test_context_fit_skips_a_call_with_every_call_that_needs_its_answer():
    from cbbench.harness.load.context_fit import fit_to_context

    wl = load_workload("agent-graph", seed=1, num_requests=60)
    fitted, fit = fit_to_context(wl, 1400, 16)  # the preset's long prompts: some calls overflow
    assert fit.skipped and fit.sessions_cut
    kept = {r.index: r for r in fitted.requests}
    for r in fitted.requests:
        assert all(p in kept for p in r.graph.after)  # nothing waits on a call not sent
        assert all(src in kept for _, src in r.graph.live)
        assert r.graph.calls == sum(q.session_id == r.session_id for q in fitted.requests)
    reducers = [r for r in wl.requests if r.graph.name == "reducer"]
    assert any(r.index not in kept for r in reducers)  # the join needs every branch


def test_context_fit_counts_a_calls_messages_with_the_servers_tokenizer():
    """The trace's prompt_len is another tokenizer's count: with the server's (/tokenize;
    here one token a character, as tiny's byte-level vocabulary nearly is) a call whose
    recorded messages overflow is skipped before the run, not sent to get HTTP 400."""
    import json as _json

    from cbbench.harness.load.context_fit import fit_to_context

    def chars(r) -> int:
        return sum(len(m.get("content") or "") for m in _json.loads(r.graph.messages))

    wl = load_workload("agent-graph", seed=0, num_requests=40)
    by_prompt_len = fit_to_context(wl, 2048, 16)[0]  # no /tokenize: the trace's counts
    assert any(chars(r) + r.output_len >= 2048 for r in by_prompt_len.requests)
    fitted, fit = fit_to_context(wl, 2048, 16, count=len)
    assert fit.skipped > 0 and fitted.requests
    assert all(chars(r) + r.output_len < 2048 for r in fitted.requests)
