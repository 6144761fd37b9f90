"""Multi-turn sessions through `cbbench locust`: the dispenser hands out whole sessions (no
unit twice across workers), and headless runs against real servers on loopback — the
reference engine (the same records as `cbbench bench`, each later turn resending the
server's actual reply) and the scripted server (a failed turn ends its session, `--processes
2` on a schedule, a stopping test starts no new turn)."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.load.sessions import group_sessions
from cbbench.harness.locust.dispenser import Dispenser, Plan
from cbbench.harness.locust.settings import LocustSettings, load_workload_for, workload_digest
from cbbench.harness.results.run_folder import load_run
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.workloads import with_arrivals
from cbbench.workloads.loader import build_from_spec
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from server_support import serve
from servers.fake import Behavior, FakeServerConfig, threaded

PROC_TIMEOUT_S = 120
SPEC = {
    "prompt": {"dist": "constant", "value": 40},
    "output": {"dist": "constant", "value": 6},
    "session": {
        "turns": {"dist": "uniform", "min": 2, "max": 4},
        "think_ms": {"dist": "constant", "value": 5},
        "message": {"dist": "constant", "value": 12},
    },
}


def _drain(d: Dispenser) -> list:
    out = []
    while (t := d.take()) is not None:
        out.append(t)
    return out


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 30), workers=st.integers(1, 5), schedule=st.booleans())
def test_slots_partition_the_sessions(n, workers, schedule):
    wl = build_from_spec(SPEC, "s", "spec", seed=n, num_requests=n)
    if schedule:
        wl = with_arrivals(wl, "poisson", rate=10.0)
    sessions = {tuple(r.index for r in u) for u in group_sessions(wl.requests)}
    got = []
    for k in range(workers):
        d = Dispenser(wl, schedule=schedule)
        d.assign(Plan(k, workers))
        tickets = _drain(d)
        assert d.exhausted
        for t in tickets:
            assert [s.turn for s in t.turns] == list(range(1, len(t.turns) + 1))
            assert t.due_s == (t.turns[0].arrival_s if schedule else None)
            assert all(s.arrival_s is None for s in t.turns[1:])  # later turns follow replies
            assert d.position_of(t.index_of(t.turns[-1])) == t.position
        got += [tuple(t.index_of(s) for s in t.turns) for t in tickets]
        if schedule:  # a slot takes its sessions by first arrival
            dues = [t.due_s for t in tickets]
            assert dues == sorted(dues)
    assert len(got) == len(set(got)) and set(got) == sessions  # every session once, whole


def test_cycled_sessions_get_new_indices_and_a_restart_skips_past_them():
    wl = build_from_spec(SPEC, "s", "spec", seed=2, num_requests=10)
    units = group_sessions(wl.requests)
    d = Dispenser(wl, schedule=False, cycle=True)
    d.assign(Plan(0, 1))
    laps = [d.take() for _ in range(2 * len(units))]
    indices = [t.index_of(s) for t in laps for s in t.turns]
    assert sorted(indices) == list(range(20))  # lap 1 is 10..19
    again = laps[len(units)]
    assert again.lap == 1 and again.turns == tuple(units[0])
    sid = units[0][0].session_id
    assert laps[0].session_id(units[0][0]) == sid and again.session_id(units[0][0]) == f"{sid}#1"
    done = max(d.position_of(i) for i in indices)
    assert done == d.taken_max == 2 * len(units) - 1


def test_digest_tells_session_workloads_apart():
    a = build_from_spec(SPEC, "s", "spec", seed=1, num_requests=8)
    think = {**SPEC["session"], "think_ms": {"dist": "constant", "value": 50}}
    b = build_from_spec({**SPEC, "session": think}, "s", "spec", seed=1, num_requests=8)
    assert [r.prompt_len for r in a.requests] == [r.prompt_len for r in b.requests]
    assert workload_digest(a) != workload_digest(b)


@pytest.fixture(scope="module")
def server() -> str:
    config = EngineConfig(model="tiny", enable_prefix_caching=True, block_size=4)
    with serve(config) as (url, _):
        yield url


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spec_file(tmp_path: Path, spec: dict, n: int) -> Path:
    path = tmp_path / "sessions.json"
    path.write_text(json.dumps({**spec, "num_requests": n}), encoding="utf-8")
    return path


def _locust(url: str, spec: Path, out: Path, *argv: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "cbbench.harness.cli", "locust", "--base-url", url]
    cmd += ["--workload", str(spec), "--out", str(out), "--no-gpu-metrics"]
    cmd += ["--metrics-interval", "0.1", "--headless", "-r", "100"]
    cmd += ["--web-port", str(_free_port()), *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=PROC_TIMEOUT_S)


def _bench(url: str, wl, out: Path, endpoint: str):
    cfg = BenchConfig(
        base_url=url, workload=wl, out_dir=out, live=False, concurrency=2, endpoint=endpoint
    )
    return run_bench(cfg, console=Console(file=io.StringIO()))


def _by_session(records) -> dict[str, list]:
    out: dict[str, list] = {}
    for r in sorted(records, key=lambda r: r.turn):
        out.setdefault(r.session_id, []).append(r)
    return out


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_sessions_run_as_in_bench_against_the_reference_engine(server, tmp_path, endpoint):
    """Closed loop, 2 users = 2 chat users: the same (session, turn) records as `cbbench
    bench --concurrency 2` (with ids, the same history lengths); each later turn's prompt is the
    previous prompt and the server's actual reply (ids, or the chat messages) plus the new
    message."""
    n = 10
    spec = _spec_file(tmp_path, SPEC, n)
    wl = load_workload_for(LocustSettings(base_url="http://127.0.0.1:1", workload=str(spec)))
    proc = _locust(
        server, spec, tmp_path / "locust", "--endpoint", endpoint, "-u", "2", "-t", "45s"
    )
    bench = _bench(server, wl, tmp_path / "bench", endpoint)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = load_run(tmp_path / "locust")
    recs = run.records
    assert all(r.ok for r in recs)
    key = {(r.session_id, r.turn): r.history_len for r in recs}
    assert len(key) == len(recs) == n
    in_bench = {(r.session_id, r.turn): r.history_len for r in bench.records}
    assert key.keys() == in_bench.keys()
    if endpoint == "completions":  # ids: the history's length does not depend on the reply
        assert key == in_bench
    sessions = _by_session(recs)
    assert len(sessions) == len(group_sessions(wl.requests))
    for turns in sessions.values():
        assert [r.turn for r in turns] == list(range(1, len(turns) + 1))
        assert turns[0].history_len == 0
        for prev, cur in zip(turns, turns[1:], strict=False):
            assert cur.history_len == prev.prompt_tokens_server + prev.output_tokens_server
            if endpoint == "completions":  # the exact ids: history, then the new message
                assert cur.prompt_tokens_server == cur.history_len + cur.prompt_len
                assert cur.prompt_tokens_client == cur.prompt_tokens_server
            else:  # the messages so far (with the server's template around each)
                assert cur.prompt_tokens_server > cur.history_len + cur.prompt_len
            assert cur.sent_s >= prev.end_s + 0.005  # after the reply and the think time
            assert not cur.extra.get("history_gap")
    s = run.meta["summary"]["sessions"]
    assert s["sessions"] == len(sessions) and s["sessions_with_failure"] == 0
    assert s["prefix_cache_hit_rate_later_turns"] > 0.5  # the server got its own reply back
    assert run.meta["summary"]["duplicate_records"] == 0
    assert run.meta["load"]["cap_unit"] == bench.meta["load"]["cap_unit"] == "sessions"


SHAREGPT = [
    {
        "id": "c1",
        "conversations": [
            {"from": "human", "value": "Name a prime."},
            {"from": "gpt", "value": "Seven is prime."},
            {"from": "human", "value": "And an even one?"},
            {"from": "gpt", "value": "Two."},
        ],
    },
    {
        "id": "c2",
        "conversations": [
            {"from": "human", "value": "Why is the sky blue?"},
            {"from": "gpt", "value": "Rayleigh scattering."},
        ],
    },
]


@pytest.mark.parametrize("sessions", [True, False])
def test_sharegpt_sends_its_real_text_as_bench_does(server, tmp_path, sessions):
    """ShareGPT's human messages go out as they are (before, Locust sent generated text of
    their length): the server counts the same first-turn prompts as from `cbbench bench`."""
    trace = tmp_path / "sg.json"
    trace.write_text(json.dumps(SHAREGPT), encoding="utf-8")
    spec = tmp_path / "sg_spec.json"
    spec.write_text(json.dumps({"trace": {"path": str(trace), "sessions": sessions}}))
    wl = load_workload_for(LocustSettings(base_url="http://127.0.0.1:1", workload=str(spec)))
    assert len(wl) == (3 if sessions else 2)
    proc = _locust(server, spec, tmp_path / "locust", "--endpoint", "chat", "-u", "2", "-t", "45s")
    bench = _bench(server, wl, tmp_path / "bench", "chat")
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = load_run(tmp_path / "locust").records
    assert all(r.ok for r in recs) and len(recs) == len(wl)
    first = {r.session_id: r.prompt_tokens_server for r in recs if r.turn == 1}
    assert first == {r.session_id: r.prompt_tokens_server for r in bench.records if r.turn == 1}
    assert len(first) == 2
    if sessions:
        c1 = _by_session(recs)["c1"]
        assert [r.turn for r in c1] == [1, 2]
        assert c1[1].history_len == c1[0].prompt_tokens_server + c1[0].output_tokens_server


def test_processes_on_a_schedule_and_a_failed_turn_ends_its_session(tmp_path):
    """`--processes 2`, sessions started by a constant arrival rate: each session runs whole
    on one worker, none twice; the session whose turn 2 fails sends no later turn."""
    n = 24
    spec = _spec_file(tmp_path, SPEC, n)
    wl = load_workload_for(
        LocustSettings(
            base_url="http://127.0.0.1:1", workload=str(spec), rate=30.0, arrival="constant"
        )
    )
    units = group_sessions(wl.requests)
    broken = next(u for u in units if len(u) >= 3)  # its turn 2 fails: turn 3 is never sent
    fake = FakeServerConfig(Behavior(itl_s=0.001), rules={broken[1].index: Behavior(status=500)})
    with threaded(fake) as srv:
        argv = ("--rate", "30", "--arrival", "constant", "--processes", "2", "-u", "4")
        argv += ("--master-port", str(_free_port()))
        proc = _locust(srv.url, spec, tmp_path / "run", *argv, "-t", "45s")
    assert proc.returncode == 1, proc.stderr[-3000:]  # Locust's: a request failed
    run = load_run(tmp_path / "run")
    got = sorted((r.session_id, r.turn) for r in run.records)
    assert len(got) == len(set(got)) == n - (len(broken) - 2)
    assert {r.worker for r in run.records} == {0, 1}
    arrival = {r.index: r.arrival_s for r in wl.requests}
    for sid, turns in _by_session(run.records).items():
        assert len({r.worker for r in turns}) == 1
        assert [r.turn for r in turns] == list(range(1, len(turns) + 1))
        assert turns[0].scheduled_s == pytest.approx(arrival[turns[0].index], abs=1e-9)
        assert all(r.scheduled_s is None for r in turns[1:])
        for prev, cur in zip(turns, turns[1:], strict=False):
            assert cur.sent_s >= prev.end_s
            assert cur.history_len == prev.prompt_tokens_server + prev.output_tokens_server
        if sid == broken[0].session_id:
            assert [r.ok for r in turns] == [True, False]
            assert turns[1].error_kind == "http_5xx"
        else:
            assert all(r.ok for r in turns)
    s = run.meta["summary"]["sessions"]
    assert s["sessions"] == len(units) and s["sessions_with_failure"] == 1


def test_replies_without_token_ids_leave_a_marked_gap(tmp_path):
    """`--no-extensions`: the server returns no token ids and there is no tokenizer, so an ids
    history cannot hold the reply: later turns say so, as in bench."""
    spec = _spec_file(tmp_path, SPEC, 8)
    with threaded(FakeServerConfig(Behavior(itl_s=0.001))) as srv:
        proc = _locust(srv.url, spec, tmp_path / "run", "--no-extensions", "-u", "2", "-t", "45s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = load_run(tmp_path / "run")
    assert len(run.records) == 8 and all(r.ok for r in run.records)
    for turns in _by_session(run.records).values():
        assert not turns[0].extra.get("history_gap")
        for prev, cur in zip(turns, turns[1:], strict=False):
            assert cur.extra["history_gap"] is True
            assert cur.history_len == prev.history_len + prev.prompt_len  # the messages only
    later = sum(r.turn > 1 for r in run.records)
    assert later > 0 and run.meta["summary"]["sessions"]["history_gaps"] == later


def test_a_stopping_test_starts_no_new_turn(tmp_path):
    """Sessions of 5 turns, 0.8 s of thinking between them, stopped by `-t 2s`: each
    session's records are its first turns, in order; the rest never went out."""
    think = {
        **SPEC["session"],
        "turns": {"dist": "constant", "value": 5},
        "think_ms": {"dist": "constant", "value": 800},
    }
    spec = _spec_file(tmp_path, {**SPEC, "session": think}, 15)
    with threaded(FakeServerConfig(Behavior(itl_s=0.001))) as srv:
        proc = _locust(srv.url, spec, tmp_path / "run", "-u", "3", "-t", "2s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = load_run(tmp_path / "run")
    assert run.records and all(r.ok for r in run.records)
    sessions = _by_session(run.records)
    assert len(sessions) <= 3  # one session per user at a time
    for turns in sessions.values():
        assert [r.turn for r in turns] == list(range(1, len(turns) + 1))
        assert len(turns) < 5  # cut by the stop
        for prev, cur in zip(turns, turns[1:], strict=False):
            assert cur.sent_s >= prev.end_s + 0.8
    assert run.meta["summary"]["cancelled_in_flight"] <= 3
