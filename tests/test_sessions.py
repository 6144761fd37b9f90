"""Multi-turn sessions: the spec section, the history each turn resends, and whole runs
against the reference engine's real server (prefix caching on), token for token."""

from __future__ import annotations

import io
import json
import re

import pytest
from cbbench.harness.client.api import ClientConfig
from cbbench.harness.client.reply import Reply
from cbbench.harness.console.live import summary_table
from cbbench.harness.load.runner import BenchConfig, _plans, run_bench
from cbbench.harness.load.sessions import History, group_sessions, turn_message
from cbbench.harness.report import build_report
from cbbench.harness.results.run_folder import load_run
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.workloads import WorkloadError, load_trace, load_workload, with_arrivals
from cbbench.workloads.loader import build_from_spec
from cbbench.workloads.native import read_native, write_native_jsonl
from cbbench.workloads.spec import RequestSpec, Workload
from cbbench.workloads.summary import summarize_workload
from rich.console import Console
from server_support import serve

SPEC = {
    "prompt": {"dist": "constant", "value": 40},
    "output": {"dist": "constant", "value": 6},
    "session": {
        "turns": {"dist": "uniform", "min": 2, "max": 4},
        "think_ms": {"dist": "constant", "value": 5},
        "message": {"dist": "constant", "value": 12},
    },
}


def test_spec_sessions_number_turns_and_time_only_first_turns():
    wl = build_from_spec(SPEC, "s", "spec", seed=3, num_requests=30)
    assert len(wl) == 30
    units = group_sessions(wl.requests)
    assert len(units) == wl.source["sessions"]
    for unit in units:
        assert [r.turn for r in unit] == list(range(1, len(unit) + 1))
        assert unit[0].prompt_len == 40 and unit[0].think_s is None
        assert all(r.prompt_len == 12 and r.think_s == 0.005 for r in unit[1:])
    assert all(2 <= len(u) <= 4 for u in units[:-1])  # the last one may be cut at N
    timed = with_arrivals(wl, "poisson", rate=10.0)
    assert [r.arrival_s is not None for r in timed.requests] == [r.turn == 1 for r in wl.requests]
    smaller = build_from_spec(SPEC, "s", "spec", seed=3, num_requests=10)
    assert smaller.requests == wl.requests[:10]  # N requests are the first N of more


def test_native_jsonl_keeps_session_fields(tmp_path):
    reqs = (
        RequestSpec(0, 5, 3, 0.0, session_id="a", turn=1),
        RequestSpec(1, 7, 3, None, session_id="a", turn=2, think_s=1.25, text="héllo\nyou"),
    )
    wl = Workload("n", 0, reqs)
    write_native_jsonl(wl, tmp_path / "w.jsonl")
    assert read_native(tmp_path / "w.jsonl", "n").requests == reqs


def test_history_resends_prompt_and_reply():
    h = History("ids")
    p1 = h.prompt([5, 6])
    h.add(p1, Reply(token_ids=[9, 8]), None, 2)
    assert h.prompt([7]) == [5, 6, 9, 8, 7] and h.tokens == 4
    c = History("chat")
    m1 = c.prompt("hi")
    c.add(m1, Reply(text=["hel", "lo"]), 10, 2)
    assert c.prompt("again") == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again"},
    ]
    assert c.tokens == 12
    gap = History("ids")
    gap.add(gap.prompt([1]), Reply(text=["x"]), None, 1)  # no ids, no tokenizer
    assert gap.gap and gap.ids == [1]


def test_workers_keep_a_session_on_one_worker():
    wl = build_from_spec(SPEC, "s", "spec", seed=1, num_requests=40)
    cfg = BenchConfig(base_url="http://127.0.0.1:1", workload=wl, workers=3, concurrency=6)
    plans = _plans(cfg, ClientConfig("http://127.0.0.1:1", "m"))
    owner: dict[str, set[int]] = {}
    for p in plans:
        for j in p.jobs:
            owner.setdefault(j.session_id, set()).add(p.worker)
    assert len(owner) == wl.source["sessions"] and all(len(w) == 1 for w in owner.values())
    assert sorted(j.index for p in plans for j in p.jobs) == list(range(40))


def _run(url, wl, tmp_path, **kw):
    cfg = BenchConfig(base_url=url, workload=wl, out_dir=tmp_path / "run", live=False, **kw)
    return run_bench(cfg, console=Console(file=io.StringIO()))


@pytest.fixture(scope="module")
def server():
    config = EngineConfig(model="tiny", enable_prefix_caching=True, block_size=4)
    with serve(config) as (url, _):
        yield url


@pytest.mark.parametrize(("cap_unit", "seed"), [("sessions", 10), ("requests", 11)])
def test_turns_resend_prompt_and_reply_token_for_token(server, tmp_path, cap_unit, seed):
    wl = build_from_spec(SPEC, "s", "spec", seed=seed, num_requests=9)  # fresh prompts each
    res = _run(server, wl, tmp_path, concurrency=2, cap_unit=cap_unit, keep_token_ids=True)
    recs = res.records
    assert len(recs) == 9 and all(r.ok for r in recs)
    written = load_run(res.run_dir).records  # the ids are in requests.jsonl too
    assert all(r.extra["reply_token_ids"] for r in written)
    by_session: dict[str, list] = {}
    for r in recs:
        by_session.setdefault(r.session_id, []).append(r)
    for turns in by_session.values():
        turns.sort(key=lambda r: r.turn)
        for prev, cur in zip(turns, turns[1:], strict=False):
            history = prev.extra["prompt_token_ids"] + prev.extra["reply_token_ids"]
            assert cur.extra["prompt_token_ids"][: len(history)] == history  # what the server got
            assert len(cur.extra["prompt_token_ids"]) == len(history) + cur.prompt_len
            assert cur.history_len == len(history)
            assert cur.sent_s >= prev.end_s + 0.005  # after the reply, plus the think time
        assert turns[0].history_len == 0
    s = res.summary["sessions"]
    assert s["sessions"] == len(by_session) and s["sessions_with_failure"] == 0
    assert s["ttft_turn1_s"]["count"] + s["ttft_later_turns_s"]["count"] == 9
    assert s["prefix_cache_hit_rate_turn1"] == 0.0  # fresh prompts
    assert s["prefix_cache_hit_rate_later_turns"] > 0.5  # the history is cached
    rates = [s["by_turn"][t]["prefix_cache_hit_rate"] for t in sorted(s["by_turn"], key=int)]
    assert len(rates) >= 3 and rates[0] == 0.0 < rates[1]
    assert all(b >= a - 0.02 for a, b in zip(rates[1:], rates[2:], strict=False))  # rising
    assert s["history_len"]["max"] > s["history_len"]["p50"] > 0
    out = io.StringIO()
    Console(file=out, width=200).print(summary_table(res.summary))
    assert f"sessions {len(by_session)} (up to " in out.getvalue()
    html = build_report([res.run_dir]).html()
    turn_chart = re.search(r'<svg[^>]*data-points="(\d+)"><title>TTFT by turn', html)
    assert turn_chart and int(turn_chart.group(1)) >= 4  # p50 and p90 at >= 2 turns
    assert "prefix-cache hits by turn" in html


def test_session_cap_holds_a_slot_through_the_session(server, tmp_path):
    wl = build_from_spec(SPEC, "s", "spec", seed=0, num_requests=9)
    res = _run(server, wl, tmp_path, concurrency=1, cap_unit="sessions")
    recs = sorted(res.records, key=lambda r: r.sent_s)
    order = [r.session_id for r in recs]
    assert order == sorted(order, key=order.index)  # one session at a time, in turn


def test_chat_sessions_resend_the_conversation(server, tmp_path):
    wl = build_from_spec(SPEC, "s", "spec", seed=12, num_requests=6)
    res = _run(server, wl, tmp_path, endpoint="chat", concurrency=2)
    assert all(r.ok for r in res.records)
    by_session: dict[str, list] = {}
    for r in sorted(res.records, key=lambda r: r.turn):
        by_session.setdefault(r.session_id, []).append(r)
    for turns in by_session.values():
        for prev, cur in zip(turns, turns[1:], strict=False):
            # the server saw the previous prompt, its reply and a new message
            grown = prev.prompt_tokens_server + prev.output_tokens_server
            assert cur.prompt_tokens_server > grown
            assert cur.history_len == grown


def _mooncake(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_mooncake_chains_become_sessions(tmp_path):
    rows = [  # block 0 is everyone's system prompt; 512-token blocks
        {"timestamp": 0, "input_length": 1100, "output_length": 100, "hash_ids": [0, 1, 2]},
        {"timestamp": 1000, "input_length": 700, "output_length": 50, "hash_ids": [0, 9]},
        {"timestamp": 5000, "input_length": 1300, "output_length": 80, "hash_ids": [0, 1, 3]},
        {"timestamp": 6000, "input_length": 1600, "output_length": 10, "hash_ids": [0, 1, 3, 4]},
        {"timestamp": 7000, "input_length": 1700, "output_length": 10, "hash_ids": [0, 1, 5, 6]},
        {"timestamp": 9500, "input_length": 900, "output_length": 10, "hash_ids": [0, 9, 8]},
    ]
    wl = load_trace(_mooncake(tmp_path / "m.jsonl", rows), sessions=True)
    r = wl.requests
    assert [(x.session_id, x.turn) for x in r] == [
        ("m0", 1),
        ("m1", 1),
        ("m0", 2),  # starts with request 0's full blocks [0, 1]
        ("m0", 3),  # starts with request 2's full blocks [0, 1] (the latest with them)
        ("m4", 1),  # so does this, but request 2 was already continued: a branch
        ("m5", 1),  # request 1 has one full block only ([0], everyone's): no evidence
    ]
    assert r[2].prompt_len == 1300 - 1100 - 100 and r[2].think_s == 5.0
    assert r[3].prompt_len == 1600 - 1300 - 80 and r[3].think_s == 1.0
    stats = wl.source["sessions"]
    assert stats["multi_turn_sessions"] == 1 and stats["continuations"] == 2
    fast = with_arrivals(wl, "replay", time_scale=2.0)
    assert fast.requests[2].think_s == 2.5  # think times scale with the replay


def test_bundled_mooncake_trace_sessions():
    stats = load_workload("mooncake-sessions").source["sessions"]
    assert stats == {
        "sessions": 8196,
        "multi_turn_sessions": 2008,
        "continuations": 3835,
        "max_turns": 43,
        "new_message_clamped": 337,
    }


def test_sessions_only_for_traces_that_have_them(tmp_path):
    path = tmp_path / "w.jsonl"
    write_native_jsonl(Workload("n", 0, (RequestSpec(0, 5, 3),)), path)
    with pytest.raises(WorkloadError, match="sessions are recovered from mooncake and sharegpt"):
        load_trace(path, sessions=True)


SHAREGPT = [
    {
        "id": "c1",
        "conversations": [
            {"from": "human", "value": "Name a prime."},
            {"from": "gpt", "value": "Seven is prime."},
            {"from": "human", "value": "And an even one?"},
            {"from": "gpt", "value": "Two."},
            {"from": "human", "value": "no reply to this"},
        ],
    },
    {"id": "c2", "conversations": [{"from": "human", "value": "Hello there"}]},
    {
        "id": "c3",
        "conversations": [
            {"from": "human", "value": "Why is the sky blue?"},
            {"from": "gpt", "value": "Rayleigh scattering."},
        ],
    },
]


def test_sharegpt_sessions_send_their_real_text(server, tmp_path):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(SHAREGPT), encoding="utf-8")
    wl = load_trace(path, sessions=True)
    assert [(r.session_id, r.turn, r.text) for r in wl.requests] == [
        ("c1", 1, "Name a prime."),
        ("c1", 2, "And an even one?"),
        ("c3", 1, "Why is the sky blue?"),
    ]
    assert wl.requests[1].output_len == 1  # ceil(len("Two.") / 4)
    assert wl.source["rows_skipped"] == {"no_reply": 1}
    res = _run(server, wl, tmp_path, endpoint="chat", concurrency=2, keep_token_ids=True)
    assert all(r.ok for r in res.records)
    seen = {
        (r.session_id, r.turn): bytes(t - 3 for t in r.extra["prompt_token_ids"] if 3 <= t < 259)
        for r in res.records
    }  # the tiny model's byte tokenizer: id = byte + 3
    assert b"Name a prime." in seen[("c1", 2)] and b"And an even one?" in seen[("c1", 2)]
    assert b"Why is the sky blue?" in seen[("c3", 1)]


def test_open_loop_starts_sessions_by_the_arrival_process(server, tmp_path):
    wl = with_arrivals(
        build_from_spec(SPEC, "s", "spec", seed=13, num_requests=9), "constant", rate=20.0
    )
    summary = summarize_workload(wl)
    assert summary["sessions"]["count"] == len(group_sessions(wl.requests))
    assert summary["mean_rate"] == pytest.approx(20.0)  # sessions per second
    res = _run(server, wl, tmp_path, concurrency=None)
    assert len(res.records) == 9 and all(r.ok for r in res.records)
    for r in res.records:
        if r.turn == 1:
            assert r.scheduled_s == pytest.approx(wl.requests[r.index].arrival_s)
            assert r.sent_s >= r.scheduled_s
        else:
            assert r.scheduled_s is None and r.history_len > 0


def test_worker_processes_keep_each_session_in_order(tmp_path):
    from servers.fake import Behavior, FakeServerConfig, threaded

    wl = build_from_spec(SPEC, "s", "spec", seed=14, num_requests=16)
    with threaded(FakeServerConfig(Behavior(itl_s=0.001))) as srv:
        res = _run(srv.url, wl, tmp_path, concurrency=4, workers=2)
    assert sorted(r.index for r in res.records) == list(range(16))
    by_session: dict[str, list] = {}
    for r in res.records:
        by_session.setdefault(r.session_id, []).append(r)
    assert {r.worker for r in res.records} == {0, 1}
    for turns in by_session.values():
        turns.sort(key=lambda r: r.turn)
        assert len({r.worker for r in turns}) == 1
        assert [r.turn for r in turns] == list(range(1, len(turns) + 1))
        for prev, cur in zip(turns, turns[1:], strict=False):
            assert cur.sent_s >= prev.end_s and cur.history_len > prev.history_len


def test_later_turns_get_fresh_messages_not_the_prefix_blocks():
    from cbbench.harness.load.loadgen import Job, Worker, WorkerPlan

    jobs = [
        Job(0, 600, 4, prefix_ids=(0, 1), session_id="m0", turn=1),
        Job(1, 20, 4, prefix_ids=(0, 1, 2), session_id="m0", turn=2),
    ]
    plan = WorkerPlan(0, jobs, [], ClientConfig("http://127.0.0.1:1", "m"), 1, None, 0, 512)
    w = Worker(plan, lambda *_: None)
    first, second = (turn_message(w.prompts, "ids", j, j.index) for j in jobs)
    block0 = w.prompts.token_ids(9, 512, (0,))
    assert first[:512] == block0  # turn 1: the shared system-prompt block
    assert len(second) == 20 and second != block0[:20]  # turn 2: its own new message


def test_session_spec_errors_name_the_key():
    for spec, match in (
        ({**SPEC, "session": 3}, "'session' must be a table"),
        ({**SPEC, "session": {"think_ms": 5}}, "missing 'turns'"),
        ({**SPEC, "session": {"turns": 2, "pause": 1}}, "session: unknown key 'pause'"),
        ({**SPEC, "prefix": {"shared_blocks": 1}}, "'prefix' cannot be combined with 'session'"),
        ({"trace": "mooncake-conv", "session": {"turns": 2}}, "'session' cannot be combined"),
    ):
        with pytest.raises(WorkloadError, match=match):
            build_from_spec(spec, "s", "spec.toml", num_requests=4)


def test_history_encodes_replies_without_ids_when_it_has_a_tokenizer():
    h = History("ids", encode=lambda text: [ord(c) for c in text])
    h.add(h.prompt([1, 2]), Reply(text=["A", "B"]), None, 2)  # the server sent no token ids
    assert h.prompt([3]) == [1, 2, 65, 66, 3] and not h.gap


def test_a_repeated_conversation_id_starts_a_new_session():
    reqs = [RequestSpec(i, 4, 2, session_id="a", turn=t) for i, t in enumerate((1, 2, 1, 2))]
    assert [[r.index for r in u] for u in group_sessions(reqs)] == [[0, 1], [2, 3]]


def test_plain_sharegpt_sends_its_first_message_as_text(server, tmp_path):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(SHAREGPT), encoding="utf-8")
    wl = load_trace(path)  # no sessions: the first exchange of each conversation
    res = _run(server, wl, tmp_path, concurrency=2, keep_token_ids=True)
    sent = {r.session_id: bytes(t - 3 for t in r.extra["prompt_token_ids"]) for r in res.records}
    assert sent == {"c1": b"Name a prime.", "c3": b"Why is the sky blue?"}  # byte tokenizer
    assert all(r.prompt_tokens_server == len(r.extra["prompt_token_ids"]) for r in res.records)


def test_the_offline_replay_runs_sessions_turn_after_turn():
    from cbbench.reference_engine.sim.simulate import simulate

    spec = {**SPEC, "session": {**SPEC["session"], "think_ms": {"dist": "constant", "value": 500}}}
    wl = build_from_spec(spec, "s", "spec", seed=0, num_requests=12)
    cfg = EngineConfig(model="tiny", enable_prefix_caching=True, block_size=4)
    res = simulate(wl.requests, cfg, prefix_block_size=wl.prefix_block_size, seed=wl.seed)
    sims = {r.index: r for r in res.requests}
    for unit in group_sessions(wl.requests):
        for prev, cur in zip(unit, unit[1:], strict=False):
            p, c = sims[prev.index], sims[cur.index]
            assert c.arrival_s == pytest.approx(p.finished_s + 0.5)  # reply, then think time
            assert c.prompt_len == p.prompt_len + len(p.output_token_ids) + cur.prompt_len
            assert c.num_cached_tokens >= p.prompt_len - cfg.block_size  # the history hits
        assert sims[unit[0].index].num_cached_tokens == 0


def test_diagnose_flags_sessions_that_miss_the_prefix_cache(server, tmp_path):
    from cbbench.harness.diagnose import diagnose_run
    from cbbench.harness.results.run_folder import load_run

    spec = {**SPEC, "session": {**SPEC["session"], "turns": {"dist": "constant", "value": 4}}}
    wl = build_from_spec(spec, "s", "spec", seed=15, num_requests=12)
    with serve(EngineConfig(model="tiny", block_size=4)) as (no_cache, _):
        off = _run(no_cache, wl, tmp_path / "off")
    on = _run(server, wl, tmp_path / "on")
    found = {f.rule: f for f in diagnose_run(load_run(off.run_dir)).findings}
    assert "session-cache" in found
    assert found["session-cache"].values["later_turn_hit_rate"] == 0.0
    assert "--enable-prefix-caching" in found["session-cache"].fixes["cbbench"]
    assert "session-cache" not in {f.rule for f in diagnose_run(load_run(on.run_dir)).findings}
