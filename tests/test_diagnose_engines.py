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
