"""`cbbench probe` against the reference engine (simulated executor paced to the wall clock,
on 127.0.0.1): it must name the batching of `cbbench serve --scheduler static|dynamic|
continuous`, and see prefix caching and chunked prefill switched on and off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cbbench.harness.cli import main
from cbbench.harness.probe.verdicts import first_cluster, prefix_caching
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.servers.launcher import launch_reference_server

from tests.diagnose_support import hardware_file, sim_args


def probe(tmp_path: Path, scheduler: str, phases: str, *server: str, budget: int = 400) -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)
    hw = hardware_file(tmp_path)
    out = tmp_path / f"probe-{scheduler}"
    with launch_reference_server("tiny", scheduler, "cpu", sim_args(hw, *server)) as srv:
        argv = ["probe", "--base-url", srv.base_url, "--out", str(out), "--phases", phases]
        assert main([*argv, "--max-time", "120", "--max-requests", str(budget)]) == 0
    index = json.loads((out / "probe.json").read_text())
    assert index["requests"] <= budget
    if budget < 400:
        return index
    assert (out / "calibrate" / "requests.jsonl").exists()  # phases are ordinary run folders
    return {v["name"]: v for v in index["verdicts"]}


@pytest.mark.parametrize("scheduler", ["static", "dynamic", "continuous"])
def test_probe_names_the_batching(tmp_path: Path, scheduler: str, capsys) -> None:
    if scheduler == "continuous":  # one server for the "off" checks too
        phases, server = "batching,prefix-cache,chunked-prefill", ["--no-enable-chunked-prefill"]
    else:
        phases, server = "batching", []
    verdicts = probe(tmp_path, scheduler, phases, *server)
    v = verdicts["batching"]
    assert v["value"] == scheduler, v
    assert v["confidence"] >= 0.5 and v["evidence"]
    out = capsys.readouterr().out
    assert "batching:" in out and "confidence" in out
    if scheduler == "continuous":
        assert verdicts["prefix_caching"]["value"] == "off", verdicts["prefix_caching"]
        assert verdicts["chunked_prefill"]["value"] == "off", verdicts["chunked_prefill"]


def test_probe_sees_prefix_caching_and_chunked_prefill_on(tmp_path: Path) -> None:
    on = probe(
        tmp_path,
        "continuous",
        "prefix-cache,chunked-prefill",
        "--enable-prefix-caching",
        "--max-num-batched-tokens",
        "256",
    )
    assert on["prefix_caching"]["value"] == "on", on["prefix_caching"]
    assert on["chunked_prefill"]["value"] == "on", on["chunked_prefill"]


def test_probe_stays_within_its_request_budget(tmp_path: Path, capsys) -> None:
    index = probe(tmp_path, "continuous", "batching,max-batch", budget=46)
    # calibrate 1 warm-up + 5, batching 16 + 7, concurrency 1, 2, 4 (4 + 4 + 8) = 45;
    # concurrency 8 (16 more) is skipped
    assert index["requests"] == 45
    # one batch-1 pace: the calibration's lone requests and the concurrency-1 level's, pooled,
    # and the batching verdict quotes that figure, not the calibration's alone
    pace = index["pace"]
    assert pace["lone_requests"] == 5 + 4
    batching = next(v for v in index["verdicts"] if v["name"] == "batching")
    assert f"TPOT at batch 1: {pace['tpot_s'] * 1e3:.1f} ms" in " ".join(batching["evidence"])
    level = tmp_path / "probe-continuous" / "concurrency-1" / "requests.jsonl"
    tpots = [r["tpot_s"] for r in map(json.loads, level.read_text().splitlines()) if r["tpot_s"]]
    mid = sorted(tpots)[len(tpots) // 2]
    assert 0.5 * mid <= pace["tpot_s"] <= 2 * mid, (pace, tpots)
    assert any(s.startswith("max-batch: over the budget") for s in index["skipped"])
    assert "skipped max-batch: over the budget" in capsys.readouterr().out


def test_probe_bad_input_is_one_line(tmp_path: Path, capsys) -> None:
    assert main(["probe", "--base-url", "http://127.0.0.1:9", "--out", str(tmp_path)]) == 2
    assert "cannot reach server" in capsys.readouterr().err
    assert main(["probe", "--base-url", "http://x", "--max-requests", "3"]) == 2


def _rec(i: int, ttft: float) -> RequestRecord:
    return RequestRecord(
        id=f"r{i}",
        index=i,
        prompt_len=8,
        output_len=2,
        sent_s=0.0,
        first_token_s=ttft,
        ttft_s=ttft,
        end_s=ttft + 0.01,
    )


def test_verdict_helpers_on_hand_made_records() -> None:
    assert first_cluster([0.03, 0.031, 0.032, 0.5, 0.51], tpot_s=0.01) == 3
    assert first_cluster([0.03] * 8, tpot_s=0.01) == 8
    # fresh F at 0.2 s, repeats R at 0.02 s, a short prompt at 0.01 s: on
    recs = [_rec(i, 0.2 if k == "F" else 0.02) for i, k in enumerate("FRRFRFRF")]
    assert prefix_caching(recs, "FRRFRFRF", 0.01).value == "on"
    recs = [_rec(i, 0.2) for i in range(8)]
    assert prefix_caching(recs, "FRRFRFRF", 0.01).value == "off"
    recs = [_rec(i, 0.0105) for i in range(8)]  # the long prefill costs nothing: cannot tell
    v = prefix_caching(recs, "FRRFRFRF", 0.01)
    assert v.value == "unknown" and "too cheap" in v.text
    # issue 51: a 30 ms prefill under a 400 ms batch-fill wait is not "cheap": the wait masks it
    recs = [_rec(i, 0.43) for i in range(8)]
    v = prefix_caching(recs, "FRRFRFRF", 0.40)
    assert v.value == "unknown" and "cheap" not in v.text
    assert "the long prefill (30.0 ms) is under 10 % of TTFT p50 430 ms" in v.text
    assert "batch-fill delay" in v.text


def _level(c: int, ttft: float, tpot: float, n_out: int = 16) -> tuple[int, list[RequestRecord]]:
    recs = []
    for i in range(2 * c):
        end = ttft + tpot * (n_out - 1)
        recs.append(
            RequestRecord(
                id=f"c{c}-{i}",
                index=i,
                prompt_len=16,
                output_len=n_out,
                sent_s=0.0,
                first_token_s=ttft,
                ttft_s=ttft,
                tpot_s=tpot,
                end_s=end,
                output_tokens_server=n_out,
            )
        )
    return c, recs


def test_max_batch_knee_from_throughput_and_from_a_lasting_ttft_jump() -> None:
    from cbbench.harness.probe.verdicts import max_batch

    # throughput grows until 8 and then stays: the knee is 8
    levels = [_level(c, 0.02 * max(1, c / 8), 0.01 * max(1, c / 8) ** 0) for c in (1, 2, 4, 8)]
    levels += [_level(c, 0.02 * c / 8 * 4, 0.01 * c / 8) for c in (16, 32)]
    assert max_batch(levels, 0.01).value == "8"
    # a TTFT jump that lasts, with TPOT flat: requests queue behind a full batch of 4
    levels = [_level(c, 0.03, 0.01) for c in (1, 2, 4)] + [
        _level(8, 0.2, 0.01),
        _level(16, 0.5, 0.01),
    ]
    assert max_batch(levels, 0.01).value == "4"
    # a one-level TTFT blip is noise, not a knee
    levels = [_level(1, 0.02, 0.01), _level(2, 0.1, 0.01), _level(4, 0.02, 0.01 * 1.0)]
    assert max_batch(levels, 0.01).value != "1"


def test_ctrl_c_keeps_what_finished(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    hw = hardware_file(tmp_path)
    out = tmp_path / "probe"
    with launch_reference_server("tiny", "continuous", "cpu", sim_args(hw)) as srv:
        cmd = [sys.executable, "-m", "cbbench.harness.cli", "probe", "--base-url", srv.base_url]
        cmd += ["--out", str(out), "--phases", "max-batch"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60
        level = out / "concurrency-2" / "requests.jsonl"
        while not (level.exists() and level.read_text().count("\n") >= 1):
            assert proc.poll() is None and time.monotonic() < deadline, "probe never got going"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, stdout
    assert "Traceback" not in stdout
    index = json.loads((out / "probe.json").read_text())
    assert index["status"] == "interrupted" and index["pace"]["tpot_s"] > 0
    calibration = (out / "calibrate" / "requests.jsonl").read_text().splitlines()
    assert len(calibration) == 6  # the warm-up is kept, marked, and not counted in the pace
    assert [json.loads(line)["warmup"] for line in calibration].count(True) == 1
