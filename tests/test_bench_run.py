"""Whole runs (`run_bench`) against the scripted server: open loop with a cap, closed loop,
warmup, --workers 2 merging, and a server killed mid-run."""

import io
import json
import threading
import time

import pytest
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.results.run_folder import load_run
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console
from servers.fake import Behavior, FakeServerConfig, process, threaded


def _wl(n, output_len=5, arrival=None):
    return Workload("t", 0, tuple(RequestSpec(i, 8, output_len, arrival) for i in range(n)))


def _run(url, wl, tmp_path, **kw):
    cfg = BenchConfig(base_url=url, workload=wl, out_dir=tmp_path / "run", live=False, **kw)
    return run_bench(cfg, console=Console(file=io.StringIO()))


def _max_overlap(records):
    events = sorted([(r.sent_s, 1) for r in records] + [(r.end_s, -1) for r in records])
    cur = best = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


def test_open_loop_with_cap_reports_client_queue_time(tmp_path):
    with threaded(FakeServerConfig(Behavior(ttft_s=0.1))) as srv:
        res = _run(srv.url, _wl(6, arrival=0.0), tmp_path, concurrency=2)
    recs = sorted(res.records, key=lambda r: r.sent_s)
    assert len(recs) == 6 and all(r.ok for r in recs)
    assert all(r.scheduled_s == 0.0 for r in recs)
    assert sum(r.client_queue_s > 0.09 for r in recs) == 4  # two waves waited for a slot
    for r in recs:  # the wait is client queue time, not TTFT
        assert r.ttft_s < 0.1 + 0.05
        assert r.sent_s == pytest.approx(r.scheduled_s + r.client_queue_s + r.send_lag_s)
    assert _max_overlap(recs) <= 2
    q = res.summary["client_queue_s"]
    assert q["count"] == 6 and q["max"] >= 0.18


def test_closed_loop_keeps_concurrency_and_excludes_warmup(tmp_path):
    beh = Behavior(itl_s=0.002, short_by=1)
    with threaded(FakeServerConfig(beh)) as srv:
        res = _run(srv.url, _wl(12), tmp_path, concurrency=3, warmup=2)
    measured = [r for r in res.records if not r.warmup]
    warm = [r for r in res.records if r.warmup]
    assert len(measured) == 12 and len(warm) == 2
    assert all(r.sent_s < 0 for r in warm) and all(r.sent_s >= 0 for r in measured)
    assert _max_overlap(measured) <= 3
    s = res.summary
    assert s["counts"]["completed"] == 12 and s["counts"]["warmup_excluded"] == 2
    assert s["counts"]["short_outputs"] == 12  # every output came back 1 token short
    run = load_run(res.run_dir)
    assert run.meta["status"] == "complete" and run.meta["interrupted"] is False
    assert run.meta["summary"]["counts"] == s["counts"]
    assert run.meta["target"]["model"] == "fake-model" and run.meta["target"]["scheduler"] == "fake"
    assert {r.id for r in run.records} == {r.id for r in res.records}
    samples = [x for x in run.timeseries if x.get("source") == "client"]
    assert all("loop_lag_max_s" in x and "cpu" in x for x in samples)


def test_two_workers_merge_without_loss_or_duplicates(tmp_path):
    with threaded(FakeServerConfig(Behavior(itl_s=0.001))) as srv:
        res = _run(srv.url, _wl(40), tmp_path, concurrency=4, workers=2)
    lines = (res.run_dir / "requests.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    assert sorted(r["index"] for r in recs) == list(range(40))
    assert len({r["id"] for r in recs}) == 40
    assert all(r["worker"] == r["index"] % 2 for r in recs)
    assert all(r["status"] == "ok" and r["sent_s"] >= 0 for r in recs)
    assert res.meta["load"]["workers"] == 2


def test_server_killed_mid_run_every_request_on_disk(tmp_path):
    def kill_after_first_record(srv) -> None:
        # kill once a request has finished (on disk), not after a fixed delay: on a loaded
        # machine the first requests may take longer than any fixed timer
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if any(f.stat().st_size for f in tmp_path.glob("run/**/requests.jsonl")):
                break
            time.sleep(0.01)
        srv.kill()

    with process(FakeServerConfig(Behavior(itl_s=0.02))) as srv:
        killer = threading.Thread(target=kill_after_first_record, args=(srv,))
        killer.start()
        res = _run(srv.url, _wl(12, output_len=15), tmp_path, concurrency=3, timeout_s=5)
        killer.join()
    recs = load_run(res.run_dir).records
    assert len(recs) == 12 and len({r.index for r in recs}) == 12
    ok = [r for r in recs if r.ok]
    failed = [r for r in recs if not r.ok]
    assert ok and failed
    assert {r.error_kind for r in failed} <= {"stream", "connection"}
    s = res.summary
    assert s["counts"]["failed"] == len(failed) and s["ttft_s"]["count"] == len(ok)
    assert s["error_rate"] == pytest.approx(len(failed) / 12)


def test_duration_stops_new_requests(tmp_path):
    with threaded(FakeServerConfig(Behavior(itl_s=0.02))) as srv:
        res = _run(srv.url, _wl(50, output_len=10), tmp_path, concurrency=2, duration_s=0.5)
    recs = res.records
    assert 2 <= len(recs) < 50  # each takes ~0.2 s: at most a few rounds of 2 fit
    assert all(r.ok and r.ready_s < 0.5 for r in recs)  # none started after the duration


def test_live_view_and_summary_table_render(tmp_path):
    from cbbench.harness.console.live import LiveStats, LiveView, summary_table

    with threaded(FakeServerConfig(Behavior())) as srv:
        res = _run(srv.url, _wl(5), tmp_path, concurrency=2, slo={"e2e": 1.0})
    stats = LiveStats(5)
    for r in res.records:
        stats.on_record(r)
    stats.on_sample({"source": "client", "worker": 0, "sent": 8})
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    with LiveView(stats, console):
        pass
    console.print(stats.render())
    console.print(summary_table(res.summary))
    text = console.file.getvalue()
    assert "done" in text and "5/5" in text and "in flight 3" in text
    assert "TTFT (ms)" in text and "goodput" in text


def test_more_workers_than_slots_loses_no_request(tmp_path):
    with threaded(FakeServerConfig(Behavior())) as srv:
        res = _run(srv.url, _wl(5), tmp_path, concurrency=1, workers=3)
    assert sorted(r.index for r in res.records) == list(range(5))
    assert res.meta["load"]["workers"] == 1 and _max_overlap(res.records) == 1


def test_chat_with_tokenizer_sends_exact_length_text(tmp_path):
    from test_bench_prompts import _word_tokenizer

    _word_tokenizer(tmp_path / "tokenizer.json")
    wl = Workload("t", 0, tuple(RequestSpec(i, 20 + i, 4, prefix_ids=(1,)) for i in range(4)), 8)
    with threaded(FakeServerConfig(Behavior())) as srv:  # it counts prompt words as tokens
        res = _run(srv.url, wl, tmp_path, endpoint="chat", tokenizer=str(tmp_path), concurrency=2)
    assert all(r.ok for r in res.records)
    assert all(
        r.prompt_tokens_client == r.prompt_tokens_server == r.prompt_len for r in res.records
    )
    assert res.summary["counts"]["prompt_token_mismatch"] == 0
    assert res.meta["load"]["text_prompts"] is True
