"""Synthetic run folders for report/gate/sweep tests, written with the real RunWriter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.run_folder import RunWriter


def write_run(
    path: Path,
    n: int = 200,
    seed: int = 0,
    ttft_scale: float = 1.0,
    tail_scale: float = 1.0,
    tpot_scale: float = 1.0,
    noise_seed: int | None = None,
    errors: int = 0,
    workload: str = "synthetic-chat",
    workload_seed: int = 7,
    meta: dict | None = None,
    rate: float = 4.0,
    model: str = "tiny",
    error_message: str = "HTTP 500: engine overloaded",
    max_output: int = 64,
) -> Path:
    """A run of `n` requests; `noise_seed` draws the latency noise (defaults to `seed`).

    `tail_scale` multiplies the slowest 5% of TTFTs (a p99 regression that leaves p50 alone).
    """
    rng_w = np.random.default_rng(workload_seed)  # workload: same lengths for the same seed
    prompt = rng_w.integers(16, 512, n)
    out = rng_w.integers(4, max_output, n)
    rng = np.random.default_rng(seed if noise_seed is None else noise_seed)
    ttft = (0.02 + prompt * 1e-4) * rng.lognormal(0.0, 0.25, n) * ttft_scale
    cut = np.quantile(ttft, 0.95)
    ttft = np.where(ttft >= cut, ttft * tail_scale, ttft)
    tpot = 0.01 * rng.lognormal(0.0, 0.15, n) * tpot_scale
    w = RunWriter(path)
    t_sent = np.cumsum(rng_w.exponential(1.0 / rate, n))
    for i in range(n):
        sent = float(t_sent[i])
        ok = i >= errors
        gaps = list(np.full(int(out[i]) - 1, tpot[i])) if ok else []
        first = sent + float(ttft[i])
        times = list(first + np.concatenate([[0.0], np.cumsum(gaps)])) if ok else []
        e2e = times[-1] - sent if ok else None
        w.add_record(
            RequestRecord(
                id=f"r{i}",
                index=i,
                prompt_len=int(prompt[i]),
                output_len=int(out[i]),
                scheduled_s=sent,
                ready_s=sent,
                sent_s=sent,
                first_token_s=first if ok else None,
                last_token_s=times[-1] if ok else None,
                token_times_s=[float(t) for t in times],
                ttft_s=float(ttft[i]) if ok else None,
                tpot_s=float(tpot[i]) if ok and out[i] > 1 else None,
                e2e_s=e2e,
                itl_s=[float(g) for g in gaps],
                server_queue_s=float(ttft[i]) * 0.3 if ok else None,
                output_tokens_client=int(out[i]) if ok else None,
                output_tokens_server=int(out[i]) if ok else None,
                finish_reason="length" if ok else None,
                status="ok" if ok else "error",
                error=None if ok else error_message,
                error_kind=None if ok else "http_5xx",
            )
        )
    end = float(t_sent[-1]) + 2.0
    for k, t in enumerate(np.arange(0.0, end, 0.25)):
        running = float(np.sum((t_sent <= t) & (t_sent + ttft + tpot * out >= t)))
        w.add_sample(
            {
                "t_s": float(t),
                "source": "server",
                "running": running,
                "waiting": float(k % 3),
                "kv_usage": min(1.0, running / 20.0),
            }
        )
        w.add_sample({"t_s": float(t) + 0.01, "source": "gpu", "util_gpu": 40.0 + 10 * (k % 5)})
    w.write_run(
        {
            "name": path.name,
            "workload": {"name": workload, "seed": workload_seed, "num_requests": n},
            "load": {"rate": rate},
            "target": {"base_url": "http://127.0.0.1:8000", "model": model},
            "environment": {"python": "3.11", "hardware": "synthetic"},
            **(meta or {}),
        }
    )
    w.close()
    return path
