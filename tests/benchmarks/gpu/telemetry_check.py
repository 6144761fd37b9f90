"""One-command GPU check for a lent GPU machine: NVML sampling under a torch matmul load.

    python -m tests.benchmarks.gpu.telemetry_check --out DIR [--seconds 10]

Samples every GPU NVML sees at 4 Hz while a bf16 matmul loop keeps device 0 busy, then
writes DIR/gpu_check.json (the sampler's summary and every sample) and prints one line.
Exits 2 when there is no NVIDIA GPU (one line), 1 when NVML never saw the loaded GPU busy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cbbench.harness.telemetry.gpu import GpuSampler


def _matmul_load(seconds: float) -> dict:
    import torch

    dev = torch.device("cuda", 0)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize(dev)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            a = (a @ b) * 1e-2
        torch.cuda.synchronize(dev)
        n += 20
    elapsed = time.perf_counter() - start
    return {
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "matmuls": n,
        "seconds": elapsed,
        "tflops": 2 * 8192**3 * n / elapsed / 1e12,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.gpu.telemetry_check")
    p.add_argument("--out", required=True, type=Path, help="folder for gpu_check.json")
    p.add_argument("--seconds", type=float, default=10.0, help="load duration (default 10)")
    p.add_argument("--interval", type=float, default=0.25, help="NVML interval (default 0.25)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    samples: list[dict] = []
    sampler = GpuSampler(interval_s=args.interval)
    t0 = time.monotonic_ns()
    sampler.start(t0, samples.append)
    result: dict = {"load": None, "error": None}
    try:
        if sampler.unavailable_reason is None:
            time.sleep(1.0)  # an idle baseline before the load
            result["load"] = _matmul_load(args.seconds)
            time.sleep(1.0)
    except Exception as exc:  # noqa: BLE001 - the report must say what broke on the machine
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        sampler.stop()
    summary = sampler.summary()
    result.update(summary=summary, samples=samples)
    (args.out / "gpu_check.json").write_text(json.dumps(result, indent=1), encoding="utf-8")

    if not summary["available"]:  # 2: nothing to check here (run_all.py's "needs-cuda")
        print(f"gpu_check: needs an NVIDIA GPU: {summary['reason']}", file=sys.stderr)
        return 2
    busy = [s["util_gpu"] for s in samples if s.get("index") == 0 and "util_gpu" in s]
    ok = result["error"] is None and bool(busy) and max(busy) > 0
    load = result["load"] or {}
    print(
        f"gpu_check: {'OK' if ok else 'FAIL'}: {len(samples)} samples from "
        f"{len(summary['devices'])} GPU(s); device 0 util max {max(busy, default=0):.0f}%, "
        f"mean {summary.get('gpu_util', {}).get('mean', 0):.0f}%; "
        f"power max {summary.get('power_w', {}).get('max', float('nan')):.0f} W; "
        f"energy {summary.get('energy_j', float('nan')):.0f} J; "
        f"load {load.get('tflops', 0):.0f} TFLOP/s; -> {args.out / 'gpu_check.json'}"
        + (f"; error: {result['error']}" if result["error"] else "")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
