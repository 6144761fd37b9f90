"""The first GPU check: what the machine is, and what the engine's start-up warm-up buys.

    python -m tests.benchmarks.gpu.env_check --out DIR

Writes DIR/env.json: Python, torch, Triton and CUDA versions, the device (name, capability,
memory), `nvidia-smi`'s one line, which of cbbench's dependencies import; then the warm-up
probe: two fresh interpreters, each with an empty Triton cache, build the engine ("small",
fp32, eager decode) with the warm-up off and on and time the first and second request's
time to first token. Off, the first TTFT holds Triton's compiles; on, it should be near the
second. Without CUDA the probe runs on the CPU ("tiny"; the warm-up is skipped there, so
off == on) and the check still passes: it is the dry run of itself. Exit 0 unless a probe
fails to run.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEPS = ("torch", "triton", "numpy", "httpx", "pandas", "rich", "pynvml", "prometheus_client",
        "fastapi", "uvicorn", "safetensors", "tokenizers", "yaml", "jinja2",
        "cbbench.harness.cli", "cbbench.reference_engine.server.app")  # fmt: skip
FOUND_ONLY = ("locust",)  # importing it monkey-patches the process (gevent): looked up only


def imports() -> dict[str, str]:
    out = {}
    for name in DEPS:
        try:
            mod = importlib.import_module(name)
            out[name] = str(getattr(mod, "__version__", "ok"))
        except Exception as exc:  # noqa: BLE001 - the report says what is missing there
            out[name] = f"MISSING: {type(exc).__name__}: {exc}"[:200]
    for name in FOUND_ONLY:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        out[name] = "found" if found else "MISSING: not installed"
    return out


def device_info() -> dict:
    import torch

    info: dict = {"python": platform.python_version(), "torch": torch.__version__,
                  "cuda_build": torch.version.cuda, "cuda_available": torch.cuda.is_available()}  # fmt: skip
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info |= {"device": p.name, "capability": f"{p.major}.{p.minor}",
                 "memory_gib": round(p.total_memory / 2**30, 1),
                 "multiprocessors": p.multi_processor_count}  # fmt: skip
    smi = shutil.which("nvidia-smi")
    if smi:
        q = "--query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu"
        r = subprocess.run([smi, q, "--format=csv,noheader"], capture_output=True, text=True,
                           timeout=20)  # fmt: skip
        info["nvidia_smi"] = (r.stdout or r.stderr).strip()
    return info


def probe(warmup: bool) -> dict:
    """In this (fresh) interpreter: engine start with the warm-up on or off, then two
    requests one after the other; their first-token times."""
    import torch
    from cbbench.reference_engine.config.engine_config import ContinuousConfig, EngineConfig
    from cbbench.reference_engine.engine import llm_engine
    from cbbench.reference_engine.sampling_params import SamplingParams

    cuda = torch.cuda.is_available()
    if not warmup:
        llm_engine.should_warm_up = lambda _runner: False
    cfg = EngineConfig(model="small" if cuda else "tiny", device="cuda" if cuda else "cpu",
                       dtype="float32", num_kv_blocks=256, max_model_len=512,
                       enforce_eager=True,
                       continuous=ContinuousConfig(max_num_seqs=8, max_num_batched_tokens=256))  # fmt: skip
    t0 = time.perf_counter()
    engine = llm_engine.LLMEngine.from_config(cfg)
    start_s = time.perf_counter() - t0
    ttft = []
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    for i in range(2):
        engine.add_request(f"r{i}", [(3 * i + j) % 300 + 5 for j in range(100 + 7 * i)], params)
        t0, first = time.perf_counter(), None
        while engine.has_unfinished_requests():
            outs = engine.step()
            if first is None and any(o.new_token_ids for o in outs):
                if cuda:
                    torch.cuda.synchronize()
                first = time.perf_counter() - t0
        ttft.append(first)
    w = engine.warmup
    return {"warmup": warmup, "device": cfg.device, "engine_start_s": round(start_s, 3),
            "warmup_s": w.seconds if w else None, "warmup_steps": w.steps if w else None,
            "ttft_first_s": ttft[0], "ttft_second_s": ttft[1]}  # fmt: skip


def run_probe(warmup: bool, timeout_s: float, cuda: bool) -> dict:
    """On CUDA in a fresh interpreter with an empty Triton cache; on the CPU (no compiles to
    isolate: the dry run) in this one."""
    if not cuda:
        from cbbench.reference_engine.engine import llm_engine

        real = llm_engine.should_warm_up
        try:
            return probe(warmup)
        finally:
            llm_engine.should_warm_up = real
    cache = tempfile.mkdtemp(prefix="triton-cache-")  # empty: the compiles happen in the probe
    env = dict(os.environ, TRITON_CACHE_DIR=cache)
    code = ("import json; from tests.benchmarks.gpu.env_check import probe; "
            f"print(json.dumps(probe({warmup})))")  # fmt: skip
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, timeout=timeout_s)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"warmup": warmup, "error": f"timed out after {timeout_s:.0f} s"}
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if r.returncode != 0:
        return {"warmup": warmup, "error": r.stderr.strip()[-2000:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.gpu.env_check")
    p.add_argument("--out", type=Path, required=True, help="folder for env.json")
    p.add_argument("--probe-timeout", type=float, default=40.0, help="seconds per probe")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"machine": device_info(), "imports": imports()}
    import cbbench.harness

    report["cbbench_from"] = str(Path(cbbench.harness.__file__).parent.parent)
    cuda = bool(report["machine"]["cuda_available"])
    report["probes"] = [run_probe(w, args.probe_timeout, cuda) for w in (False, True)]
    (args.out / "env.json").write_text(json.dumps(report, indent=2) + "\n")
    m = report["machine"]
    missing = [k for k, v in report["imports"].items() if v.startswith("MISSING")]
    print(f"env: {m.get('device', 'no CUDA device')}, torch {m['torch']}, "
          f"triton {report['imports']['triton']}; missing imports: {missing or 'none'}")  # fmt: skip
    ok = True
    for pr in report["probes"]:
        if "error" in pr:
            ok = False
            print(f"warm-up {'on ' if pr['warmup'] else 'off'}: probe FAILED: {pr['error'][-300:]}")
        else:
            print(f"warm-up {'on ' if pr['warmup'] else 'off'} ({pr['device']}): start "
                  f"{pr['engine_start_s']:.2f} s (warm-up {pr['warmup_s']}), TTFT first "
                  f"{pr['ttft_first_s'] * 1e3:.0f} ms, second {pr['ttft_second_s'] * 1e3:.0f} ms")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
