"""`cbbench reproduce`: the seeds' timeline (22 vs 15 steps), the gains table in sustained
throughput with its conditions, and the measured CPU rows (small settings; the full run is
the documented command in docs/reproduce.md)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from cbbench.harness.cli import main
from cbbench.harness.results.run_folder import load_run
from cbbench.harness.studies import reproduce as rp
from cbbench.harness.studies import reproduce_report as rr
from cbbench.harness.studies import reproduce_stats as rs
from cbbench.harness.studies.reproduce_report import scaled_workload
from cbbench.workloads import load_workload


def test_reproduce_sim_only(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # rich: one table row per line
    out = tmp_path / "rep"
    argv = ["reproduce", "--sim-only", "--num-requests", "40", "--batch-size", "8"]
    argv += ["--sim-scale", "8", "--replicates", "3"]
    assert main([*argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "static: 22 steps" in text and "continuous: 15 steps" in text
    assert "SIMULATED" in text and "5.67x" in text and "device utilization" in text
    # every gain with its interval, the method named
    assert "95 % Student-t interval of the mean over independent replicates" in text
    assert "3 replicates per workload (seeds 0-2)" in text
    doc = json.loads((out / "reproduce.json").read_text())
    assert doc["seed_demo_steps"] == {"static": 22, "continuous": 15}
    assert doc["measured_cpu"] is None
    rows = {r["workload"]: r for r in doc["rows"]}
    assert set(rows) == {"uniform", "mixed", "heavy-mixed"}
    assert rows["heavy-mixed"]["seed"] == {
        "lengths": "highly mixed 1-4000 tokens", "static_rps": 15.0,
        "continuous_rps": 85.0, "gain": 85.0 / 15.0,
    }  # fmt: skip
    sim = {w: r["simulated"] for w, r in rows.items()}
    assert abs(sim["uniform"]["gain"] - 1.0) < 0.05
    for w, r in sim.items():
        g = rs.t_interval(r["replicate_gains"])
        assert r["seeds"] == [0, 1, 2] and r["gain"] == pytest.approx(g.mean)
        assert r["gain_interval"] == pytest.approx([g.lo, g.hi])
        assert r["verdict_vs_seed"] == rr.seed_verdict(w, g)
        assert f"{g.text()}x" in text  # printed as in the JSON
    # constant lengths: the replicates' request sets are one, so is the gain
    assert len(set(sim["uniform"]["replicate_gains"])) == 1 and sim["uniform"]["gain_ci95"] == 0
    assert len(set(sim["mixed"]["replicate_gains"])) == 3
    # the verdicts in the JSON are the ones the intervals give, and the printed lines say them
    claims = doc["claims"]["simulated"]
    assert claims == rr.claims({w: doc["simulated"][w] for w in rp.WORKLOADS})
    for claim, v in claims.items():
        assert f"{claim}: {v}" in " ".join(doc["verdicts"])
    assert sim["heavy-mixed"]["gain"] > 1.3 and sim["mixed"]["gain"] > 1.3
    for r in sim.values():
        assert r["conditions"]["static_batch_size"] == 8 and r["conditions"]["max_num_seqs"] == 8
        assert r["conditions"]["num_requests"] == 40 and r["conditions"]["length_scale"] == 8
        assert r["conditions"]["replicates"] == 3
        u = r["utilization"]
        assert 0 < u["static"]["slot_utilization"] <= u["continuous"]["slot_utilization"] + 1e-9
    # the waste static batching has: finished members hold their slot
    assert sim["mixed"]["utilization"]["static"]["slot_utilization"] < 0.8
    assert len(doc["verdicts"]) == 1 and doc["verdicts"][0].startswith("simulated (3 replicates")
    for seed in (0, 1, 2):
        run = load_run(out / "sim" / "heavy-mixed_8" / f"seed{seed}" / "continuous")
        assert run.meta["simulated"] is True and len(run.records) == 40


def test_replicates_are_fresh_request_sets_under_one_condition():
    s = rp.Setting(num_requests=24, max_num_seqs=8, length_scale=8, replicates=3, seed=4)
    written = []
    row = rp.run_replicates("heavy-mixed", s, on_result=lambda r, res: written.append(r["seed"]))
    assert row["seeds"] == [4, 5, 6] and written == [4, 5, 6]
    # one server for all: max_model_len is the longest the preset can produce (2048 + 4000) / 8
    assert row["conditions"]["max_model_len"] == 256 + 500 == rp.longest_possible("heavy-mixed", 8)
    gains = [r["gain_req_s"] for r in row["replicates"]]
    assert len(set(gains)) == 3
    assert row["gain_req_s"] == rs.t_interval(gains).to_json()
    same = rp.run_replicates("uniform", replace(s, num_requests=8), on_result=lambda r, res:
                             written.append(r["seed"]))  # fmt: skip
    assert written[3:] == [4]  # constant lengths: one request set, run once
    assert [r.get("same_requests_as_seed") for r in same["replicates"]] == [None, 4, 4]


def test_memory_reservation_sets_static_batch_and_the_gain():
    """Static reserves max_model_len per slot: with the same memory, the highly mixed
    workload's long max_model_len shrinks static's batch, and continuous gains more there."""
    base = rp.Setting(num_requests=48, max_num_seqs=16, length_scale=8)
    # 16 slots of 400 tokens: mixed's longest possible request (2048 + 1000) / 8 = 381 fits
    # 16, highly mixed's (2048 + 4000) / 8 = 756 fits 8
    base = replace(base, kv_cache_memory_gb=16 * 400 * 131072 / 2**30)
    rows = {w: rp.run_pair(w, base) for w in ("mixed", "heavy-mixed")}
    assert rows["heavy-mixed"]["conditions"]["static_batch_limited_by"] == "memory"
    assert rows["heavy-mixed"]["conditions"]["static_batch_size"] < 16
    assert rows["mixed"]["conditions"]["static_batch_size"] == 16
    assert rows["heavy-mixed"]["gain_req_s"] > rows["mixed"]["gain_req_s"]
    roomy = rp.run_pair("heavy-mixed", replace(base, kv_cache_memory_gb=100.0))
    assert roomy["conditions"]["static_batch_size"] == 16
    assert roomy["gain_req_s"] < rows["heavy-mixed"]["gain_req_s"]
    # a static engine that skips finished rows (the real one) wastes less than padded rows
    skip = rp.run_pair("heavy-mixed", replace(base, static_padded=False))
    assert skip["conditions"]["static_finished_rows"] == "skipped"
    assert 1.0 < skip["gain_req_s"] < rows["heavy-mixed"]["gain_req_s"]
    assert (
        skip["static"]["request_throughput"] > rows["heavy-mixed"]["static"]["request_throughput"]
    )


def test_sustained_window_excludes_the_drain_tail():
    row = rp.run_pair("heavy-mixed", rp.Setting(num_requests=48, max_num_seqs=8, length_scale=8))
    for k in ("static", "continuous"):
        s = row[k]
        t_a, t_b = s["window_s"]
        assert s["steady"] and 0 <= t_a < t_b < s["duration_s"]
        assert s["busy_fraction"] > 0.99
    # static: whole batches (48 requests, B=8: 5 before the last); continuous: past start-up
    st_res, co_res = row["results"]
    batch_starts = sorted({r.first_scheduled_s for r in st_res.requests})
    assert len(batch_starts) == 6 and row["static"]["window_s"] == [0, batch_starts[-1]]
    assert row["continuous"]["window_s"][0] > 0


def test_scaled_workload_divides_lengths():
    wl = scaled_workload("heavy-mixed", 20, 4)
    full = scaled_workload("heavy-mixed", 20, 1)
    assert wl.name == "heavy-mixed/4" and len(wl) == 20
    for a, b in zip(wl.requests, full.requests, strict=True):
        assert a.output_len == max(1, b.output_len // 4)
        assert a.prompt_len == max(1, b.prompt_len // 4)


def test_reproduce_bad_flag(capsys):
    assert main(["reproduce", "--sim-only", "--batch-size", "0"]) == 2
    err = capsys.readouterr().err
    assert "--batch-size must be >= 1" in err and "Traceback" not in err
    assert main(["reproduce", "--sim-only", "--workload-seed", "-1"]) == 2
    assert "--workload-seed must be >= 0, got -1" in capsys.readouterr().err


def test_reproduce_measured_part_on_tiny(tmp_path, capsys, monkeypatch):
    """The CPU half end to end on a very small setting: real engine runs, one table."""
    monkeypatch.setenv("COLUMNS", "250")
    out = tmp_path / "rep"
    argv = ["reproduce", "--num-requests", "16", "--batch-size", "4", "--cpu-model", "tiny"]
    argv += ["--sim-scale", "16"]
    argv += ["--cpu-requests", "6", "--cpu-batch-size", "2", "--cpu-scale", "64", "--clock", "cpu"]
    argv += ["--cpu-replicates", "2", "--replicates", "2", "--workload-seed", "1"]
    assert main([*argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "MEASURED, CPU" in text and "MEASURED: the real engine (tiny) on CPU, B=2" in text
    doc = json.loads((out / "reproduce.json").read_text())
    rows = {r["workload"]: r["measured_cpu"] for r in doc["rows"]}
    assert set(rows) == {"uniform", "mixed", "heavy-mixed"}
    assert all(r["gain"] > 0 and r["conditions"]["executor"] == "real" for r in rows.values())
    # measured rows: intervals by the same method, over their own (fewer) replicates
    assert all(len(r["replicate_gains"]) == 2 and r["seeds"] == [1, 2] for r in rows.values())
    assert all("n = 2" in r["interval_method"] for r in rows.values())
    assert doc["verdicts"][1].startswith("measured on CPU (2 replicates")
    assert doc["claims"]["measured_cpu"] == rr.claims(doc["measured_cpu"])
    run = load_run(out / "cpu" / "heavy-mixed_64" / "seed2" / "static")
    assert run.meta["simulated"] is False and len(run.records) == 6


def test_gpu_check_says_it_needs_cuda_and_sizes_memory_like_the_server(capsys):
    from tests.benchmarks.gpu import reproduce_gpu
    assert reproduce_gpu.main(["--device", "cpu"]) == 2
    assert "needs CUDA" in capsys.readouterr().err
    args = reproduce_gpu.parse_args(["--batch-size", "16", "--num-requests", "64"])
    s = reproduce_gpu.gpu_setting(args, "heavy-mixed")
    reqs = rp.scaled(load_workload("heavy-mixed", num_requests=64).requests, 4)
    _, _, cond = rp.configs(s, reqs)
    # a pool of B mean-length requests: static's max_model_len reservation shrinks its batch
    assert cond["static_batch_limited_by"] == "memory" and cond["static_batch_size"] < 16


def test_run_pair_reports_progress_over_both_replays():
    calls: list[tuple[int, int]] = []
    s = rp.Setting(num_requests=6, max_num_seqs=4, length_scale=16)
    rp.run_pair("mixed", s, on_progress=lambda done, n: calls.append((done, n)))
    assert calls[-1] == (12, 12) and all(n == 12 for _, n in calls)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)  # static's, then continuous'
