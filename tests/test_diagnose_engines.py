"""Diagnosis rules on other engines' telemetry (no GPU, no vLLM here: run folders written the
way cbbench records a vLLM or Triton run — the same fields, the engine's own gaps), so the
paths a cbbench server never takes are checked too: GPU utilization instead of batch
occupancy, a running-count plateau instead of occupancy, engine-specific silences."""

from __future__ import annotations

from pathlib import Path

from cbbench.harness.diagnose import diagnose_run
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.run_folder import Run


def _run(engine: str | None, samples: list[dict], records: list[RequestRecord] | None = None):
    meta = {"name": "synthetic", "load": {"concurrency": 2}}
    if engine:
        meta["summary"] = {"telemetry": {"server": {"engine": engine}}}
    recs = records or [
        RequestRecord(
            id=f"r{i}",
            index=i,
            prompt_len=32,
            output_len=32,
            sent_s=0.5 * i,
            first_token_s=0.5 * i + 0.05,
            last_token_s=0.5 * i + 0.4,
            end_s=0.5 * i + 0.4,
            ttft_s=0.05,
            e2e_s=0.4,
            tpot_s=0.011,
            output_tokens_server=32,
            token_times_s=[0.5 * i + 0.05 + 0.011 * k for k in range(32)],
            itl_s=[0.011] * 31,
        )  # fmt: skip
        for i in range(20)
    ]
    return Run(dir=Path("synthetic"), meta=meta, records=recs, timeseries=samples)


def _server(n: int = 40, **fields) -> list[dict]:
    return [{"t_s": 0.25 * i, "source": "server", **fields} for i in range(n)]


def rules(run: Run) -> set[str]:
    return {f.rule for f in diagnose_run(run).findings}


def test_vllm_low_gpu_use_with_memory_to_spare() -> None:
    gpu = [{"t_s": 0.25 * i, "source": "gpu", "gpu": 0, "util_gpu": 18.0} for i in range(40)]
    run = _run("vllm", _server(running=1.0, waiting=0.0, kv_usage=0.04) + gpu)
    d = diagnose_run(run)
    f = next(f for f in d.findings if f.rule == "low-concurrency")
    assert "GPU utilization mean 18%" in f.evidence[0]
    assert d.engine == "vllm" and "--concurrency" in f.fixes["vllm"]
    busy = [{"t_s": 0.25 * i, "source": "gpu", "gpu": 0, "util_gpu": 92.0} for i in range(40)]
    assert "low-concurrency" not in rules(_run("vllm", _server(running=1.0, kv_usage=0.04) + busy))


def test_vllm_batch_cap_from_a_running_plateau() -> None:
    samples = _server(running=4.0, waiting=10.0, kv_usage=0.2)
    f = next(f for f in diagnose_run(_run("vllm", samples)).findings if f.rule == "batch-cap")
    assert "its maximum of 4 running" in f.evidence[0]
    assert "--max-num-seqs" in f.fixes["vllm"] and "--max-running-requests" in f.fixes["sglang"]
    # the same plateau with a full KV pool is memory pressure, not a batch cap
    assert "batch-cap" not in rules(_run("vllm", _server(running=4.0, waiting=10.0, kv_usage=0.97)))


def test_vllm_preemptions_from_the_server_counter() -> None:
    samples = [
        {"t_s": 0.25 * i, "source": "server", "kv_usage": 0.99, "preemptions_total": float(i)}
        for i in range(40)
    ]
    f = next(f for f in diagnose_run(_run("vllm", samples)).findings if f.rule == "kv-pressure")
    assert f.values["preemptions"] == 39 and "server counter" in f.evidence[0]
    assert "kv-pressure" not in rules(_run("vllm", _server(kv_usage=0.99, preemptions_total=3.0)))


def test_queue_delay_is_silent_for_iteration_level_engines_and_fires_for_unknown_ones() -> None:
    recs = _run(None, []).records
    for r in recs:
        r.server_queue_s, r.ttft_s = 0.30, 0.32  # a fixed 300 ms wait before every batch
    assert "queue-delay" not in rules(_run("vllm", _server(running=1.0), recs))
    found = diagnose_run(_run(None, [], recs)).findings
    q = next(f for f in found if f.rule == "queue-delay")
    assert "max_queue_delay_microseconds" in q.fixes["triton"]


def test_no_signal_no_finding() -> None:
    # no server metrics at all: the telemetry rules stay silent instead of guessing
    assert rules(_run(None, [])) == set()


def _batched(batch_gap_s: float, n_batches: int = 3) -> tuple[list[RequestRecord], list[dict]]:
    """A run-to-completion server at batch 4: every request sent at t = 0; batch k starts when
    batch k-1's longest member (1 s) ends plus `batch_gap_s` (an idle batcher waiting to
    fill, when > 0); members decode 0.2, 0.4, 0.6 and 1 s. Records and the running/waiting
    gauges sampled every 0.05 s, as a Triton-like server exports them."""
    durs = (0.2, 0.4, 0.6, 1.0)
    recs, spans = [], []
    for k in range(n_batches):
        start = batch_gap_s + k * (1.02 + batch_gap_s)
        for j, d in enumerate(durs):
            n = int(d / 0.01)
            times = [start + 0.01 * (i + 1) for i in range(n)]
            timing = dict(first_token_s=times[0], last_token_s=times[-1], end_s=times[-1])
            recs.append(
                RequestRecord(
                    id=f"b{k}-{j}",
                    index=4 * k + j,
                    prompt_len=16,
                    output_len=n,
                    sent_s=0.0,
                    ttft_s=times[0],
                    e2e_s=times[-1],
                    tpot_s=0.01,
                    server_queue_s=start,
                    output_tokens_server=n,
                    token_times_s=times,
                    itl_s=[0.01] * (n - 1),
                    **timing,
                )
            )
            spans.append((start, times[-1]))
    samples = []
    for i in range(int(n_batches * (1.02 + batch_gap_s) / 0.05) + 1):
        t = 0.05 * i + 0.001
        running = sum(a <= t < b for a, b in spans)
        waiting = sum(a > t for a, _ in spans)
        samples.append({"t_s": t, "source": "server", "running": running, "waiting": waiting})
    return recs, samples


def test_run_to_completion_waits_are_held_slots_not_a_batching_delay() -> None:
    # requests queue behind running batches whose finished members keep their slots
    recs, samples = _batched(batch_gap_s=0.0)
    d = diagnose_run(_run("triton", samples, recs))
    found = {f.rule: f for f in d.findings}
    assert "queue-delay" not in found, found["queue-delay"].evidence
    hol = found["hol-blocking"]
    assert hol.values["mode"] == "run-to-completion" and hol.values["slots"] == 4
    assert 0.3 <= hol.values["idle_share"] <= 0.7 and hol.values["running_drops"] >= 3
    assert 0.3 <= hol.values["refill_p50_s"] <= 0.85  # an end -> the batch's longest member's
    assert "in-flight (continuous) batching" in hol.fixes["triton"]
    # the same server on vLLM's telemetry: iteration-level, so no held slots are claimed
    assert "hol-blocking" not in rules(_run("vllm", samples, recs))


def test_an_idle_batcher_is_a_batching_delay_not_held_slots() -> None:
    # each batch waits 1.5 s with nothing running before it starts: a batcher waiting to fill
    recs, samples = _batched(batch_gap_s=1.5)
    found = {f.rule: f for f in diagnose_run(_run("triton", samples, recs)).findings}
    q = found["queue-delay"]
    assert q.values["queue_busy_share"] < 0.5
    assert any("ran no request for" in e for e in q.evidence)
    assert found.get("hol-blocking") is None or found["hol-blocking"].values["mode"] != (
        "run-to-completion"
    )
