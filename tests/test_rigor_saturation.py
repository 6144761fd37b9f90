"""Over-saturation in `cbbench bench` (harness/conclusions/saturation.py, saturation_watch.py):
a run at twice the fake server's capacity stops early with the saturation line, exit 4 and
every finished request kept; the rule itself on synthetic queues, stable and growing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cbbench.harness.cli import main
from cbbench.harness.conclusions import saturation
from cbbench.harness.conclusions.saturation_watch import SaturationWatch
from cbbench.harness.results.outcome import EXIT_SATURATED
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.servers.fake_load import LoadModel
from servers.fake import Behavior, FakeServerConfig, threaded

NO_TELEMETRY = ["--no-server-metrics", "--no-gpu-metrics", "--no-live"]


def queue(rate: float, service_s: float, slots: int, n: int, seed: int = 0):
    """An FCFS queue with `slots` servers, Poisson arrivals: (arrivals, records)."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    free = [0.0] * slots
    recs = []
    for i, a in enumerate(arrivals):
        k = int(np.argmin(free))
        start = max(a, free[k])
        free[k] = start + service_s
        ttft = start - a + 0.2 * service_s
        recs.append(RequestRecord(
            id=str(i), index=i, prompt_len=1, output_len=4, sent_s=float(a),
            first_token_s=float(a + ttft), end_s=float(free[k]), ttft_s=float(ttft),
            e2e_s=float(free[k] - a),
        ))  # fmt: skip
    return list(arrivals), sorted(recs, key=lambda r: r.end_s)


def watch_over(arrivals, recs, mode: str = "stop") -> SaturationWatch:
    w = SaturationWatch(arrivals, mode)
    stopped = []
    w.bind_stop(lambda: stopped.append(True))
    for r in recs:
        w.on_record(r)
    assert bool(stopped) == (w.found is not None and mode == "stop")
    return w


def test_the_rule_fires_on_a_growing_queue_and_not_on_a_busy_stable_one() -> None:
    # capacity 2 / 0.1 s = 20/s
    for seed in range(5):
        w = watch_over(*queue(17.0, 0.1, 2, 600, seed))  # 85 %: queues, but keeps up
        assert w.found is None, (seed, w.found)
    arrivals, recs = queue(40.0, 0.1, 2, 600)
    w = watch_over(arrivals, recs)
    assert w.found is not None
    assert w.found["t_s"] < 15.0
    assert w.found["line"].startswith(f"over-saturated at t = {w.found['t_s']:.1f} s (")
    assert w.found["offered_rps"] == pytest.approx(40, rel=0.25)
    assert w.found["served_rps"] == pytest.approx(20, rel=0.25)
    assert "99% confidence" in w.found["reason"]
    cont = watch_over(arrivals, recs, "continue")  # found, said, not stopped
    assert cont.found is not None and cont.found["stopped"] is False


def test_closed_loops_and_bursts_are_not_judged() -> None:
    assert not SaturationWatch(None).judged  # closed loop: no schedule
    assert not SaturationWatch([0.0] * 100).judged  # all at once
    s = saturation.slope([0, 1, 2, 3, 4], [1, 1, 1, 1, 1])
    assert s is not None and s.value == 0 and s.low <= 0


def test_bench_at_twice_capacity_stops_with_the_line_and_keeps_its_records(
    tmp_path: Path, capsys
) -> None:
    # 2 slots x 1 / (50 ms + 9 x 10 ms) = 14.3 requests/s; offered 28.6/s for 21 s
    cfg = FakeServerConfig(default=Behavior(ttft_s=0.05, itl_s=0.01), load=LoadModel(slots=2))
    out = tmp_path / "run"
    with threaded(cfg) as srv:
        argv = ["bench", "--base-url", srv.url, "--workload", "prompt=16,output=10"]
        argv += ["--rate", "28.6", "--num-requests", "600", "--out", str(out)]
        assert main([*argv, *NO_TELEMETRY]) == EXIT_SATURATED
    text = capsys.readouterr().out
    assert "over-saturated at t = " in text and "req/s offered" in text and "served" in text
    meta = json.loads((out / "run.json").read_text())
    sat = meta["summary"]["over_saturated"]
    assert meta["status"] == "over-saturated" and sat["stopped"] is True
    assert sat["t_s"] < 30.0
    assert sat["served_rps"] < 0.75 * sat["offered_rps"]
    lines = (out / "requests.jsonl").read_text().splitlines()
    assert len(lines) == meta["summary"]["counts"]["total"] > 30  # every finished request kept
    assert len(lines) < 600
    assert meta["summary"]["steady_window"] is None  # no steady state to report


def test_a_short_flood_is_said_too_short_to_judge(tmp_path: Path, capsys) -> None:
    """60 requests in ~1 s at 4x the fake server's capacity: the rule needs 5 s of sends, so
    the run is not judged and says so (offered and served, the server fell behind), exit 0;
    before, only "no steady window found" was said."""
    cfg = FakeServerConfig(default=Behavior(ttft_s=0.05, itl_s=0.01), load=LoadModel(slots=2))
    out = tmp_path / "run"
    with threaded(cfg) as srv:
        argv = ["bench", "--base-url", srv.url, "--workload", "prompt=16,output=10"]
        argv += ["--rate", "60", "--num-requests", "60", "--out", str(out)]
        assert main([*argv, *NO_TELEMETRY]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("too short to judge over-sat"))
    assert "the check needs >= 5 s and >= 30 requests" in line and "fell behind" in line
    short = json.loads((out / "run.json").read_text())["summary"]["saturation_not_judged"]
    assert short["requests"] == 60 and short["sends_s"] < 5.0
    assert short["served_rps"] < 0.6 * short["offered_rps"]  # capacity 14.3/s


def test_what_the_watch_does_not_judge_says_why() -> None:
    assert SaturationWatch([0.0, 0.5, 1.0]).too_short_to_judge  # open loop, too short
    assert not SaturationWatch(None).too_short_to_judge  # closed loop: never judged
    assert not SaturationWatch([0.0] * 100).too_short_to_judge  # all at once: by design
    assert not SaturationWatch([i * 0.1 for i in range(100)]).too_short_to_judge  # judged
    kept_up = saturation.too_short([0.0, 1.0, 2.0], 3, 2.1)
    assert kept_up["offered_rps"] == 1.0 and "fell behind" not in kept_up["line"]
