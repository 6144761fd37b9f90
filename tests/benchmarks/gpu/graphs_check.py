"""Eager vs decode CUDA graphs, sync vs async scheduling: the engine-modes part of the GPU check
(`python -m tests.benchmarks.gpu.engine_check --out DIR [--modes-only]`).

Each mode runs the same greedy workload (mostly decode, batches up to max_num_seqs) on a fresh
engine and reports output tok/s, p50 step time and p50 step gap (executor idle between two
steps), the captured buckets, graph memory and capture time. Correctness: the graph streams
must equal those of "eager-padded", the same padded launches (same buckets, same host maxima)
run without graphs, and async must equal sync in each mode. Plain eager vs graphs is reported
too (`identical_to_eager`), not required: an unpadded GEMM of n rows may round differently
from a padded one of bucket rows (no batch invariance, as in vLLM).

On the CPU "graphs" runs the padded path eagerly (nothing is captured): the CPU test of this
check runs that way, so only the numbers, not the logic, need a GPU.
"""

from __future__ import annotations

import statistics
import time

import torch

MODES = (  # label, decode graphs, async scheduling
    ("eager", False, False),
    ("eager-async", False, True),
    ("graphs", True, False),
    ("graphs-async", True, True),
    ("eager-padded", None, False),  # the graphs' padded launches, run eagerly
)


def _engine(device: str, model: str, graphs: bool | None, async_: bool, sizes: dict):
    from cbbench.reference_engine.config.engine_config import ContinuousConfig, EngineConfig
    from cbbench.reference_engine.engine.llm_engine import LLMEngine
    from cbbench.reference_engine.execution.model_runner import ModelRunner

    cfg = EngineConfig(
        model=model,
        device=device,
        num_kv_blocks=sizes["num_kv_blocks"],
        block_size=16,
        max_model_len=sizes["max_model_len"],
        async_scheduling=async_,
        enforce_eager=graphs is not True,
        continuous=ContinuousConfig(
            max_num_seqs=sizes["max_num_seqs"], max_num_batched_tokens=sizes["token_budget"]
        ),
    )
    on_cuda = device.startswith("cuda")
    runner = ModelRunner(
        model,
        num_kv_blocks=cfg.num_kv_blocks or 1,
        block_size=cfg.block_size,
        device=device,
        enforce_eager=cfg.enforce_eager,
        max_num_seqs=cfg.continuous.max_num_seqs,
        max_model_len=sizes["max_model_len"],
        padded_decode=graphs is None or (graphs and not on_cuda),
    )
    if graphs is None:
        assert runner.decode_graphs is not None
        runner.decode_graphs.bound_maxima = True
    return LLMEngine(cfg, runner.model_config, runner, runner.num_kv_blocks, sizes["max_model_len"])


def _workload(engine, num_requests: int, max_tokens: int, prefix: str) -> dict[str, list[int]]:
    from cbbench.reference_engine.sampling_params import SamplingParams

    gen = torch.Generator().manual_seed(0)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i in range(num_requests):
        prompt = torch.randint(0, vocab, (8 + (13 * i) % 40,), generator=gen).tolist()
        engine.add_request(f"{prefix}{i}", prompt, params)
    return {f"{prefix}{i}": [] for i in range(num_requests)}


def _p50_ms(xs: list[float]) -> float | None:
    return statistics.median(xs) * 1e3 if xs else None


def modes_check(
    device: str = "cuda",
    model: str = "small",
    num_requests: int = 48,
    max_tokens: int = 128,
    max_num_seqs: int = 32,
    max_model_len: int = 1024,
    num_kv_blocks: int = 2048,
) -> dict:
    sizes = {
        "max_num_seqs": max_num_seqs,
        "max_model_len": max_model_len,
        "num_kv_blocks": num_kv_blocks,
        "token_budget": max(512, max_num_seqs),
    }
    cuda = device.startswith("cuda")
    result: dict = {"model": model, "device": device, **sizes, "modes": {}}
    streams: dict[str, dict[str, list[int]]] = {}
    for label, graphs, async_ in MODES:
        t0 = time.perf_counter()
        engine = _engine(device, model, graphs, async_, sizes)
        build_s = time.perf_counter() - t0
        _workload(engine, 2, 4, "warm")  # kernels compiled before the clock starts
        while engine.has_unfinished_requests():
            engine.step()
        tokens = _workload(engine, num_requests, max_tokens, "r")
        gaps: list[float] = []
        step_times: list[float] = []
        t0, steps = time.perf_counter(), 0
        while engine.has_unfinished_requests() and steps < 100_000:
            for out in engine.step():
                tokens[out.request_id].extend(out.new_token_ids)
            st = engine.get_stats()
            step_times.append(st.step_time_s)
            if st.step_gap_s is not None:
                gaps.append(st.step_gap_s)
            steps += 1
        if cuda:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        dg = engine.executor.decode_graphs
        streams[label] = tokens
        step_p50, gap_p50 = _p50_ms(step_times), _p50_ms(gaps)
        result["modes"][label] = {
            "async_scheduling": async_,
            "output_tok_per_s": sum(map(len, tokens.values())) / elapsed,
            "steps": steps,
            "step_time_p50_ms": step_p50,
            "step_gap_p50_ms": gap_p50,
            "gap_of_step": gap_p50 / step_p50 if gap_p50 is not None and step_p50 else None,
            "graph_sizes": sorted(dg.graphs) if dg is not None else [],
            "graph_memory_mib": dg.graph_memory_bytes / 2**20 if dg is not None else 0.0,
            "padded_steps": dg.replays if dg is not None else 0,
            "build_s": build_s,
        }
        del engine, dg
        if cuda:
            torch.cuda.empty_cache()
    base = streams["eager"]
    for label, _, _ in MODES:
        same = sum(streams[label][r] == base[r] for r in base)
        result["modes"][label]["identical_to_eager"] = f"{same}/{len(base)}"
    checks = {
        "graphs == eager-padded": streams["graphs"] == streams["eager-padded"],
        "graphs-async == graphs": streams["graphs-async"] == streams["graphs"],
        "eager-async == eager": streams["eager-async"] == streams["eager"],
        "graphs ran padded": result["modes"]["graphs"]["padded_steps"] > 0,
    }
    if cuda:
        checks["graphs captured"] = bool(result["modes"]["graphs"]["graph_sizes"])
    result["checks"] = checks
    result["passed"] = all(checks.values())
    return result


def summary(result: dict) -> str:
    lines = [
        f"engine modes: {result['model']} on {result['device']}, max_num_seqs "
        f"{result['max_num_seqs']}: mode  tok/s  step p50 ms  gap p50 ms  gap/step  "
        "padded steps  graphs (MiB)  identical to eager"
    ]
    eager = result["modes"]["eager"]["output_tok_per_s"]
    for label, m in result["modes"].items():
        gap = "-" if m["step_gap_p50_ms"] is None else f"{m['step_gap_p50_ms']:.3f}"
        frac = "-" if m["gap_of_step"] is None else f"{m['gap_of_step']:.1%}"
        lines.append(
            f"  {label:<13} {m['output_tok_per_s']:8.0f} ({m['output_tok_per_s'] / eager:.2f}x)"
            f"  {m['step_time_p50_ms']:.3f}  {gap}  {frac}  {m['padded_steps']}"
            f"  {len(m['graph_sizes'])} ({m['graph_memory_mib']:.0f})  {m['identical_to_eager']}"
        )
    lines += [f"  {'ok  ' if ok else 'FAIL'} {name}" for name, ok in result["checks"].items()]
    return "\n".join(lines) + "\n"
