"""Telemetry against the reference engine's real server: `cbbench bench` with the samplers on.

One small trace (16 requests, all at once) per scheduler on the tiny model. Continuous
batching allocates KV blocks on demand; static and dynamic reserve each request's whole
maximum length up front, so their reserved-but-unused KV must be higher.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from cbbench.harness.cli import main as cli_main
from cbbench.harness.results.run_folder import load_run
from cbbench.harness.servers.launcher import start_reference_server
from cbbench.harness.telemetry.adapters import CBBENCH, SERVER_FIELDS, detect
from cbbench.harness.telemetry.prom import fetch_metrics

# serial (100 Hz samples inside a ~0.12 s run): the README's command
# runs it after the parallel phase, alone
pytestmark = pytest.mark.serial

OUTPUTS = [8, 80, 16, 64, 24, 48, 32, 72, 12, 56, 20, 40, 28, 68, 36, 60]
SERVE_ARGS = {
    "static": ["--batch-size", "4"],
    "dynamic": [],
    "continuous": [],
}


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "telemetry16.jsonl"
    lines = [{"cbbench_workload": 1, "name": "telemetry16", "seed": 0}]
    lines += [
        {"index": i, "prompt_len": 16 + 8 * (i % 5), "output_len": out}
        for i, out in enumerate(OUTPUTS)
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


def bench(base_url: str, trace: Path, out: Path) -> tuple[list[dict], dict, list]:
    """Run the trace with the server sampler at 100 Hz (the continuous run lasts ~0.12 s on
    tiny: at 20 Hz a clean CI run once saw no sample inside it); (samples, summary, records)."""
    with httpx.Client() as client:
        idle = fetch_metrics(client, base_url + "/metrics")
    assert detect(idle) is CBBENCH
    fields = CBBENCH.read(idle)
    assert set(fields) == set(SERVER_FIELDS) - {"prefix_cache_hit_rate"}
    assert fields["kv_usage"] == 0 and fields["running"] == 0 and fields["waiting"] == 0
    argv = ["bench", "--base-url", base_url, "--workload", str(trace), "--out", str(out)]
    argv += ["--no-live", "--metrics-interval", "0.01", "--no-gpu-metrics"]
    assert cli_main(argv) == 0
    run = load_run(out)
    samples = [s for s in run.timeseries if s["source"] == "server"]
    return samples, run.meta["summary"]["telemetry"]["server"], run.records


@pytest.fixture(scope="module")
def runs(trace, tmp_path_factory) -> dict:
    """The three servers start (and stop) side by side; the runs go one after another."""
    base = tmp_path_factory.mktemp("runs")
    with ThreadPoolExecutor(len(SERVE_ARGS)) as pool:
        starting = {
            s: pool.submit(start_reference_server, "tiny", s, "cpu", args)
            for s, args in SERVE_ARGS.items()
        }
        servers = {}
        try:
            for s, fut in starting.items():
                servers[s] = fut.result()
            return {s: bench(srv.base_url, trace, base / s) for s, srv in servers.items()}
        finally:
            for fut in starting.values():
                if fut.exception() is None:
                    pool.submit(fut.result().stop, 2.0)


def test_kv_usage_rises_during_load_and_returns_to_zero(runs) -> None:
    samples, summary, records = runs["continuous"]
    # a scrape may time out while the engine holds the CPU (failures are counted, not fatal)
    assert summary["engine"] == "cbbench" and summary["samples"] > summary["failures"]
    assert len(records) == len(OUTPUTS) and all(r.ok for r in records)
    busy = [s for s in samples if s["kv_usage"] > 0]
    assert busy, "no sample saw KV in use"
    assert summary["kv_usage"]["max"] > 0 and summary["running"]["max"] > 0
    # the samples are on the requests' clock: KV is in use only while requests are in flight
    first_sent = min(r.sent_s for r in records)
    last_token = max(r.last_token_s for r in records)
    assert all(first_sent - 0.05 <= s["t_s"] <= last_token + 0.05 for s in busy)
    last = samples[-1]  # the closing scrape, after every request finished
    assert last["kv_usage"] == 0 and last["running"] == 0 and last["waiting"] == 0
    assert last["t_s"] > last_token
    # queue time from the histogram's change over the run: one observation per request
    q = summary["queue_time"]
    assert q["method"] == "estimated from histogram" and q["count"] == len(OUTPUTS)
    # capped by the run's own TTFT (queue <= TTFT request by request), bucket bounds given
    ttft = sorted(r.ttft_s for r in records)
    assert q["capped_by"]["bound"].startswith("client TTFT") and q["p99"] <= ttft[-1]
    lo, hi = q["bucket_s"]["p99"]
    assert lo <= q["p99"] <= hi <= ttft[-1]
    server_q = [r.server_queue_s for r in records if r.server_queue_s is not None]
    if server_q:  # the engine also reports it per request: the histogram mean must agree
        assert q["mean"] == pytest.approx(sum(server_q) / len(server_q), abs=0.01)
    # step timings from the engine's histograms: one scheduler time per step, and a gap for
    # every step that followed another with work pending (at least one per output token
    # of the longest request, minus its first)
    sched, gap = summary["scheduler_time"], summary["step_gap"]
    assert sched["count"] >= max(OUTPUTS) and sched["p50"] > 0
    assert max(OUTPUTS) - 1 <= gap["count"] <= sched["count"]


def test_static_and_dynamic_reserve_more_kv_than_continuous(runs) -> None:
    reserved = {s: runs[s][1]["kv_reserved_unused_tokens"]["max"] for s in runs}
    assert reserved["static"] > reserved["continuous"]
    assert reserved["dynamic"] > reserved["continuous"]
    for samples, _, _ in runs.values():
        assert samples[-1]["kv_usage"] == 0  # every scheduler frees its KV at the end
