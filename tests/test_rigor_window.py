"""The steady-state window (harness/conclusions/window.py): found on synthetic runs with a known
plateau, then against the fake server slowed by a known warm-up (its load model), drawn on the
report's timeline, and compared like for like by the gate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cbbench.harness.cli import main
from cbbench.harness.conclusions.window import (
    add_window_summary,
    choose_window,
    parse_window,
    steady_window,
    window_figures,
)
from cbbench.harness.errors import CbbenchError
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.servers.fake_load import LoadModel
from servers.fake import Behavior, FakeServerConfig, threaded

NO_TELEMETRY = ["--no-server-metrics", "--no-gpu-metrics", "--no-live"]


def synthetic(rate=20.0, span=20.0, ramp=4.0, factor=3.0, ttft=0.3, poisson=True, seed=0):
    """Open-loop sends; latency x `factor` at t=0 falling linearly to 1 at `ramp` s."""
    rng = np.random.default_rng(seed)
    t, out, i = 0.0, [], 0
    while t < span:
        f = 1 + (factor - 1) * max(0.0, 1 - t / ramp) if ramp else 1.0
        a, e = ttft * f, ttft * f + 9 * 0.02 * f
        out.append(RequestRecord(
            id=str(i), index=i, prompt_len=1, output_len=10, sent_s=t, first_token_s=t + a,
            end_s=t + e, last_token_s=t + e, ttft_s=a, e2e_s=e, tpot_s=0.02 * f,
            output_tokens_client=10,
        ))  # fmt: skip
        i += 1
        t += rng.exponential(1 / rate) if poisson else 1 / rate
    return out


@pytest.mark.parametrize("poisson", [False, True])
@pytest.mark.parametrize("ramp", [0.0, 4.0])
def test_window_spans_the_plateau_on_synthetic_runs(poisson: bool, ramp: float) -> None:
    recs = synthetic(ramp=ramp, poisson=poisson)
    w = steady_window(recs)
    assert w is not None
    # the plateau: latency constant for sends after the ramp, in flight level one latency on
    true_start = ramp + 0.48 if ramp else 0.48
    last_send = max(r.sent_s for r in recs)
    assert abs(w.start_s - true_start) <= 1.0, w
    assert abs(w.end_s - last_send) <= 1.0, w
    figs = window_figures(recs, w)
    assert figs["ttft_s"]["p50"] == pytest.approx(0.3, rel=0.01)


def test_a_short_or_flat_run_has_no_window_and_ranges_parse() -> None:
    assert steady_window(synthetic(span=0.2)) is None
    assert parse_window("steady") == "steady" and parse_window("all") == "all"
    assert parse_window("5:65") == (5.0, 65.0) and parse_window("5s:65s") == (5.0, 65.0)
    for bad in ("65:5", "soon", "1:2:3"):
        with pytest.raises(CbbenchError, match="--window"):
            parse_window(bad)
    recs = synthetic(ramp=0)
    w = choose_window(recs, (2.0, 6.0))
    assert w is not None and w.kind == "range" and w.duration_s == 4.0
    assert choose_window(recs, "all") is None
    few: dict = {}  # a window of a handful of requests does not lead the summary
    add_window_summary(few, synthetic(span=1.2, ramp=0), "steady")
    assert few["lead"] == "all" and "(< 20)" in few["lead_note"]
    many: dict = {}
    add_window_summary(many, recs, "steady")
    assert many["lead"] == "steady" and many["window_figures"]["counts"]["total"] >= 20


def test_bench_finds_the_window_after_a_known_warm_up(tmp_path: Path, capsys) -> None:
    """The fake server is 3x slower at its first request, falling linearly to its steady TTFT
    of 400 ms over 2 s; 40 requests/s for 6 s, constant arrivals."""
    ramp_s, ttft = 2.0, 0.4
    cfg = FakeServerConfig(
        default=Behavior(ttft_s=ttft, itl_s=0.01), load=LoadModel(ramp_s=ramp_s, ramp_factor=3.0)
    )
    out = tmp_path / "run"
    with threaded(cfg) as srv:
        argv = ["bench", "--base-url", srv.url, "--workload", "prompt=16,output=4", "--rate"]
        argv += ["40", "--arrival", "constant", "--num-requests", "240", "--out", str(out)]
        assert main([*argv, *NO_TELEMETRY]) == 0
    printed = capsys.readouterr().out
    # the window's figures as a table beside the whole run's (not one line after it)
    assert "steady window" in printed and "TTFT p99 (ms)" in printed
    assert "(whole run " not in printed
    summary = json.loads((out / "run.json").read_text())["summary"]
    w = summary["steady_window"]
    # truth: sends after 2 s meet the steady server; in flight is level one latency later
    last_send = 239 / 40
    assert abs(w["start_s"] - (ramp_s + ttft)) <= 1.0, w
    assert abs(w["end_s"] - last_send) <= 1.0, w
    assert summary["lead"] == "steady"
    ttft_p50 = summary["window_figures"]["ttft_s"]["p50"]
    assert ttft_p50 == pytest.approx(ttft, rel=0.01)
    assert summary["ttft_s"]["mean"] > 1.05 * ttft  # the whole run carries the warm-up

    html = tmp_path / "report.html"
    assert main(["report", str(out), "--out", str(html)]) == 0
    page = html.read_text()
    assert 'class="window"' in page and "Steady-state window" in page

    capsys.readouterr()
    assert main(["gate", "--baseline", str(out), "--candidate", str(out)]) == 0
    assert "compared steady window" in capsys.readouterr().out
    assert main(["gate", "--baseline", str(out), "--candidate", str(out), "--window", "all"]) == 0
    assert "compared steady window" not in capsys.readouterr().out


def test_a_run_shorter_than_the_smoothing_kernel_has_no_crash() -> None:
    # 10 requests sent over 12 ms, each 5 ms long: the kernel (at least 4 grid steps of
    # 10 ms) is longer than the grid; np.convolve(mode="same") then returned the kernel's length
    recs = [
        RequestRecord(
            id=str(i), index=i, prompt_len=1, output_len=2, sent_s=i * 0.0013,
            first_token_s=i * 0.0013 + 0.002, end_s=i * 0.0013 + 0.005,
            last_token_s=i * 0.0013 + 0.005, ttft_s=0.002, e2e_s=0.005, tpot_s=0.003,
            output_tokens_client=2,
        )
        for i in range(10)
    ]  # fmt: skip
    w = steady_window(recs)
    assert w is None or w.start_s >= 0
    summary: dict = {}
    add_window_summary(summary, recs, "steady")
    assert summary["lead"] == "all"
