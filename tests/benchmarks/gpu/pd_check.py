"""Prefill/decode disaggregation on CUDA: the KV export/import path of the engine roles
(engine/disagg.py, ModelRunner.export_kv / import_kv) with the cache on the GPU.

    python -m tests.benchmarks.gpu.pd_check [--model small] [--out results/gpu-check]

For each KV dtype (auto, fp8): an aggregated engine, a prefill engine (kv_export) and a
decode engine (kv_import) on cuda:0; greedy outputs of the decode engine must equal the
aggregated engine's token for token, both pools end empty, and the payload's bytes per
token are reported with the export (device -> host) and import (host -> device) times.
Writes pd_check.json; exits 2 without CUDA, 3 when a stream differs or a block leaks.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


def drain(engine) -> dict:
    out: dict = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.kv_transfer is not None:
                out[o.request_id + ":kv"] = o.kv_transfer
    return out


def check(
    model: str, kv_dtype: str, n: int = 8, max_tokens: int = 32, device: str = "cuda"
) -> dict:
    from cbbench.reference_engine.config.engine_config import EngineConfig
    from cbbench.reference_engine.engine.llm_engine import LLMEngine
    from cbbench.reference_engine.sampling_params import SamplingParams

    cfg = EngineConfig(model=model, device=device, kv_cache_dtype=kv_dtype, dtype="float32")
    agg, pre, dec = (LLMEngine.from_config(cfg) for _ in range(3))
    prompts = [[(7 * i + j) % 500 + 3 for j in range(16 + 97 * i)] for i in range(n)]
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    for i, p in enumerate(prompts):
        agg.add_request(f"r{i}", p, greedy)
        pre.add_request(f"r{i}", p, SamplingParams(max_tokens=1, temperature=0), kv_export=True)
    want = drain(agg)
    t0 = time.perf_counter()
    shipped = drain(pre)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        dec.add_request(f"r{i}", p, greedy, kv_import=shipped[f"r{i}:kv"])
    got = drain(dec)
    decode_s = time.perf_counter() - t0
    same = sum(got[f"r{i}"] == want[f"r{i}"] for i in range(n))
    nbytes = sum(shipped[f"r{i}:kv"].nbytes for i in range(n))
    tokens = sum(len(p) for p in prompts)
    return {"model": model, "kv_cache_dtype": kv_dtype, "requests": n, "identical": same,
            "kv_bytes": nbytes, "bytes_per_prompt_token": nbytes / tokens,
            "prefill_s": prefill_s, "decode_s": decode_s,
            "leaked_blocks": pre.block_manager.num_used_blocks + dec.block_manager.num_used_blocks}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--out", default="results/gpu-check")
    ap.add_argument("--device", default="cuda",
                    help="cuda; cpu: the dry run (2 requests, 4 tokens; run_all.py)")  # fmt: skip
    args = ap.parse_args(argv)
    cpu = args.device == "cpu"
    if not cpu and not torch.cuda.is_available():
        print("pd_check: CUDA is not available (--device cpu: the dry run)", file=sys.stderr)
        return 2
    size = {"n": 2, "max_tokens": 4} if cpu else {}
    results = [check(args.model, kv, device=args.device, **size) for kv in ("auto", "fp8")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pd_check.json").write_text(json.dumps(results, indent=2))
    bad = False
    for r in results:
        ok = r["identical"] == r["requests"] and r["leaked_blocks"] == 0
        bad |= not ok
        print(f"{r['kv_cache_dtype']}: {r['identical']}/{r['requests']} identical, "
              f"{r['bytes_per_prompt_token']:.0f} B/prompt token, leaked {r['leaked_blocks']}"
              f" -> {'ok' if ok else 'FAIL'}")  # fmt: skip
    return 3 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
