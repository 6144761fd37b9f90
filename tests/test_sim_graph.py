"""`cbbench sim` replays agent graphs as graphs (reference_engine/sim/graph_calls.py): in
virtual time no call is admitted before its predecessors finished plus its recorded wait,
fan-out siblings run together, a session's makespan is its critical path (and far below its
calls run one after another), spliced turns are the predecessor's simulated output, the
event-skipping path gives the stepping path's results, and the graph session metrics come
out of a simulated run labelled SIMULATED."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cbbench.harness.cli import main
from cbbench.harness.studies.simulation import run_summary
from cbbench.reference_engine.config.options import SIM_DEFAULTS, build_engine_config
from cbbench.reference_engine.sim.simulate import replay, simulate
from cbbench.workloads import load_workload, with_arrivals

OTEL = Path(__file__).parent / "fixtures" / "otel"
EPS = 1e-9


def cfg(**kw):
    return build_engine_config(kw, SIM_DEFAULTS, scheduler="continuous")


def check_graph_order(wl, res) -> dict[str, tuple[float, float, float]]:
    """Every call's admission vs its predecessors; returns per session (makespan, critical
    path, calls one after another) in virtual time."""
    spec = {r.index: r for r in wl.requests}
    rec = {r.index: r for r in res.requests}
    for i, r in rec.items():
        s = spec[i]
        assert r.finished_s is not None and r.first_scheduled_s is not None
        if s.graph.after:
            ready = max(rec[p].finished_s for p in s.graph.after)
            assert r.arrival_s == pytest.approx(ready + (s.think_s or 0.0), abs=EPS), i
            assert r.first_scheduled_s >= ready - EPS, f"call {i} admitted before its predecessors"
    out = {}
    sessions: dict[str, list[int]] = {}
    for s in wl.requests:
        sessions.setdefault(s.session_id, []).append(s.index)
    for sid, calls in sessions.items():
        longest: dict[int, float] = {}  # critical path to the end of each call
        for i in sorted(calls):
            s, r = spec[i], rec[i]
            before = max((longest[p] for p in s.graph.after), default=0.0)
            wait = (s.think_s or 0.0) if s.graph.after else 0.0
            longest[i] = before + wait + (r.finished_s - r.arrival_s)
        start = min(rec[i].arrival_s for i in calls)
        makespan = max(rec[i].finished_s for i in calls) - start
        serial = sum(rec[i].finished_s - rec[i].arrival_s + (spec[i].think_s or 0.0)
                     for i in calls if spec[i].graph.after)  # fmt: skip
        serial += sum(rec[i].finished_s - rec[i].arrival_s for i in calls if not spec[i].graph.after)
        out[sid] = (makespan, max(longest.values()), serial)
    return out


def overlaps(a, b) -> bool:
    return a.first_scheduled_s < b.finished_s and b.first_scheduled_s < a.finished_s


def test_otel_fanout_is_replayed_as_a_graph():
    wl = load_workload(str(OTEL / "fanout.json"))
    res = simulate(wl.requests, cfg())
    spans = check_graph_order(wl, res)
    for makespan, critical, serial in spans.values():
        assert makespan >= critical - EPS
        assert makespan < serial  # the siblings did not run one after another
    by_parent: dict[int, list[int]] = {}
    for s in wl.requests:
        for p in s.graph.after:
            by_parent.setdefault(p, []).append(s.index)
    rec = {r.index: r for r in res.requests}
    siblings = max(by_parent.values(), key=len)
    assert len(siblings) >= 2
    for a in siblings:
        for b in siblings:
            if a < b:
                assert overlaps(rec[a], rec[b]), (a, b)


def test_fanin_waits_for_every_branch_and_splices_their_simulated_outputs():
    wl = load_workload(str(OTEL / "fanin.json"))
    res = simulate(wl.requests, cfg())
    check_graph_order(wl, res)
    rec = {r.index: r for r in res.requests}
    join = max(wl.requests, key=lambda s: len(s.graph.after))
    assert len(join.graph.after) >= 2
    assert join.graph.live, "the fixture's fan-in carries its predecessors' answers"
    # the simulated answers are in its prompt: as many tokens as they came out
    spliced = sum(len(rec[src].output_token_ids) for _, src in join.graph.live)
    spec = {s.index: s for s in wl.requests}
    recorded = sum(spec[src].output_len for _, src in join.graph.live)
    assert spliced == recorded  # ignore_eos: each answer is its max_tokens long
    assert rec[join.index].prompt_len >= spliced


def test_agent_graph_preset_with_arrivals_event_skip_agrees():
    wl = with_arrivals(load_workload("agent-graph", num_requests=60), "poisson", rate=2.0, seed=0)
    c = cfg(enable_prefix_caching=True)
    step = replay(wl.requests, c)
    skip = replay(wl.requests, c, event_skip=True)
    assert skip.skipped_steps > 0, "the event-skipping path never skipped"
    for a, b in zip(step.requests, skip.requests, strict=True):
        assert (a.arrival_s, a.prompt_len) == pytest.approx((b.arrival_s, b.prompt_len), rel=1e-9)
        assert b.finished_s == pytest.approx(a.finished_s, rel=1e-9, abs=1e-12)
        assert b.output_token_ids == a.output_token_ids
    spans = check_graph_order(wl, step)
    assert len(spans) >= 5
    for makespan, critical, _ in spans.values():
        assert makespan >= critical - EPS
    assert any(m < s - EPS for m, _, s in spans.values())  # fan-outs ran together somewhere
    # sessions arrive by the arrival process: first calls at their arrival times
    firsts: dict[str, float] = {}
    for s in wl.requests:
        firsts.setdefault(s.session_id, s.arrival_s)
    rec = {r.index: r for r in step.requests}
    for s in wl.requests:
        if not s.graph.after:
            assert rec[s.index].arrival_s >= firsts[s.session_id] - EPS
    # siblings share the orchestrator's history: the prefix cache hits
    summary = run_summary(step, "continuous")
    g = summary["graph"]
    assert g["simulated"] is True
    assert g["sessions_succeeded"] >= 5 and g["prefix_cache_hit_rate"] > 0.2
    assert g["makespan_s"]["p50"] > 0 and g["critical_path_wait_s"]["p50"] > 0


def test_sim_cli_prints_and_writes_simulated_graph_metrics(tmp_path, capsys):
    rc = main(["sim", "--workload", str(OTEL / "fanout.json"), "--scheduler", "continuous",
               "--out", str(tmp_path)])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "continuous (SIMULATED): agent graphs: 1/1 sessions succeeded" in out
    run = json.loads((tmp_path / "continuous" / "run.json").read_text())
    g = run["summary"]["graph"]
    assert g["simulated"] is True and g["session_success"] == 1.0
    assert g["fan_out_width"]["max"] >= 2


def test_drop_too_long_takes_the_calls_that_need_a_dropped_one(capsys):
    # tiny's 2048 context: the preset's long calls go, and every call after one of them
    rc = main(["sim", "--workload", "agent-graph", "--num-requests", "40", "--model", "tiny",
               "--scheduler", "continuous", "--max-model-len", "700", "--drop-too-long"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "agent-graph calls after a skipped one" in out


def test_graph_calls_without_a_session_id_skip_as_they_step():
    """A completion releases a graph call even where no session id is set: the skipping
    window ends there as it does for sessions."""
    import dataclasses

    wl = with_arrivals(load_workload("agent-graph", num_requests=60), "poisson", rate=2.0, seed=0)
    bare = [dataclasses.replace(r, session_id=None) for r in wl.requests]
    step = replay(bare, cfg())
    skip = replay(bare, cfg(), event_skip=True)
    assert skip.skipped_steps > 0
    for a, b in zip(step.requests, skip.requests, strict=True):
        assert b.arrival_s == pytest.approx(a.arrival_s, rel=1e-9, abs=1e-12)
        assert b.finished_s == pytest.approx(a.finished_s, rel=1e-9, abs=1e-12)
