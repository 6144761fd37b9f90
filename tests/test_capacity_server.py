"""`cbbench sweep --find-max-rate` on the reference server (`cbbench serve`, simulated
executor paced to the wall clock, --max-num-seqs 1, 20 ms steps: one request at a time, so the capacity is
a sharp knee near 1 / service time). With constant arrivals nothing queues below the knee and
the queue grows linearly above it: the found rate's repeat run meets the SLO and +20% does
not. Noise on a shared machine only slows the server, so the repeat is allowed a second try."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cbbench.harness.cli import main
from cbbench.harness.servers.launcher import launch_reference_server

from tests.diagnose_support import hardware_file, sim_args

# 20 ms steps: a request takes ~165 ms (capacity ~6/s), and a queue above the knee grows by
# tens of ms per request, while the SLO leaves room for the hiccups of a loaded machine
SLO = "ttft=400ms"
WORKLOAD = 'name = "capacity"\nnum_requests = 20\nseed = 0\nprompt = 16\noutput = 8\n'


def goodput(base_url: str, spec: Path, rate: float, out: Path) -> float:
    argv = ["bench", "--base-url", base_url, "--workload", str(spec), "--rate", f"{rate:.4g}"]
    argv += ["--arrival", "constant", "--slo", SLO, "--out", str(out), "--no-live"]
    argv += ["--warmup", "2"]  # connections and first-request costs stay out of the numbers
    assert main(argv) == 0
    meta = json.loads((out / "run.json").read_text())
    return meta["summary"]["goodput"]["fraction"]


@pytest.mark.slow  # ~1 min of real runs: the search's logic is test_capacity_search's, fast
def test_find_max_rate_meets_the_slo_and_20_percent_more_does_not(tmp_path: Path) -> None:
    hw = hardware_file(tmp_path, c0=0.02)
    spec = tmp_path / "capacity.toml"
    spec.write_text(WORKLOAD)
    out = tmp_path / "search"
    server = sim_args(hw, "--max-num-seqs", "1")
    with launch_reference_server("tiny", "continuous", "cpu", server) as srv:
        argv = ["sweep", "--base-url", srv.base_url, "--workload", str(spec), "--find-max-rate"]
        argv += ["--slo", SLO, "--goodput-share", "0.95", "--arrival", "constant"]
        argv += ["--num-requests", "20", "--start-rate", "2", "--out", str(out), "--no-live"]
        argv += ["--warmup", "2"]
        assert main([*argv, "--max-time", "300"]) == 0
        index = json.loads((out / "sweep.json").read_text())
        cap = index["capacity"]
        lo, hi = cap["interval"]
        assert lo is not None and hi is not None and hi / lo <= 1.1 + 1e-9, cap
        assert 2 <= lo <= 10, cap  # ~6/s modelled: 21 ms prefill + 7 x 20.5 ms decode
        assert len(index["runs"]) == len(cap["trials"]) >= 4
        tries = [goodput(srv.base_url, spec, lo, tmp_path / f"at-{k}") for k in range(2)]
        assert max(tries) >= 0.95, tries
        above = goodput(srv.base_url, spec, 1.2 * lo, tmp_path / "above")
        assert above < 0.95, above
    html = tmp_path / "report.html"
    assert main(["report", str(out), "-o", str(html)]) == 0
    assert "Goodput vs offered rate" in html.read_text()


@pytest.mark.slow  # ~3 min of real runs (issue 51's done-when, measured: 5.19 req/s, 155 s)
def test_find_max_rate_on_a_server_capped_near_6_per_s_lands_between_4_and_7_4(tmp_path):
    """The server of the test above (one request at a time, ~165 ms each: about 5.9 req/s),
    Poisson arrivals, SLO TTFT 2 s for 95 %: the over-saturation watch once stopped the 2.8
    and 4 req/s levels although every finished request met the SLO, counted them 0 % and
    reported 2.38 req/s. Now: between 4 and 7.4 req/s, or it says it cannot decide."""
    hw = hardware_file(tmp_path, c0=0.02)
    spec = tmp_path / "capacity.toml"
    spec.write_text(WORKLOAD)
    out = tmp_path / "search"
    with launch_reference_server(
        "tiny", "continuous", "cpu", sim_args(hw, "--max-num-seqs", "1")
    ) as srv:
        argv = ["sweep", "--base-url", srv.base_url, "--workload", str(spec), "--find-max-rate"]
        argv += ["--slo", "ttft=2s", "--goodput-share", "0.95", "--num-requests", "50"]
        argv += ["--out", str(out), "--no-live", "--warmup", "2", "--max-time", "400"]
        assert main(argv) == 0
    index = json.loads((out / "sweep.json").read_text())
    cap = index["capacity"]
    if cap["undecided"]:
        assert "needs" in cap["undecided"], cap
        return
    assert 4.0 <= cap["max_rate"] <= 7.4, cap
    for lv in index["levels"]:
        assert not lv["interrupted"]
        judged = lv["capacity"]
        if lv["stopped_early"]:  # said why, its goodput from what finished
            assert lv["stopped_early"].startswith(("over-saturated", "level time limit"))
            assert judged["goodput_fraction"] is not None and judged["goodput_fraction"] > 0
        if judged["state"] == "met":
            assert lv["verdict"]["too_short"] is None  # a level too short never counts as met
