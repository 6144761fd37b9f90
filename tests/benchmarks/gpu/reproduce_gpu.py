"""GPU check for the seed's utilization claim: NVML utilization from the real engine.

The seed says continuous batching keeps the GPU 80-95 % utilized where static batching falls
to 30-50 %. The simulator (`cbbench reproduce`) shows that NVML's figure — the share of time
a kernel runs — cannot tell them apart when both are saturated (both ~100 % busy), while the
useful share of the batch (slot utilization) can. This check measures both on a GPU: the
real engine (random-weight preset, in-process, all requests at t=0) runs static and
continuous over the three workloads (lengths divided by --scale, static's batch set by its
max_model_len reservation in the same KV pool), with NVML sampled every 0.1 s.

    python -m tests.benchmarks.gpu.reproduce_gpu --model qwen2.5-0.5b --out gpu-util.json

Without CUDA it says so and exits 2 (it is never a test that passes by skipping);
`--device cpu --dry-run` runs the same path on the CPU (tiny sizes: run_all.py's dry run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from cbbench.harness.errors import CbbenchError
from cbbench.harness.studies import reproduce as rp


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-0.5b", help="preset (random weights) or HF folder")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch-size", type=int, default=64, help="continuous max_num_seqs (64)")
    p.add_argument("--num-requests", type=int, default=256, help="per workload (256)")
    p.add_argument("--scale", type=int, default=4, help="divide lengths by this (4)")
    p.add_argument("--kv-blocks", type=int, default=None,
                   help="KV pool in blocks of 16 (default: B x the mean request, so memory "
                   "binds static's batch as on a full-size server)")  # fmt: skip
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    p.add_argument("--dry-run", action="store_true",
                   help="allow --device cpu: the same code path at tiny sizes (run_all.py)")  # fmt: skip
    return p.parse_args(argv)


def gpu_setting(args: argparse.Namespace, workload: str) -> rp.Setting:
    from cbbench.workloads import load_workload

    reqs = rp.scaled(load_workload(workload, num_requests=args.num_requests).requests, args.scale)
    mean = sum(r.prompt_len + r.output_len for r in reqs) / len(reqs)
    blocks = args.kv_blocks or max(1, int(args.batch_size * mean // 16) + 1)
    return rp.Setting(
        model=args.model,
        executor="real",
        num_requests=args.num_requests,
        max_num_seqs=args.batch_size,
        num_kv_blocks=blocks,
        length_scale=args.scale,
        dtype="auto",
        static_padded=False,  # the real engine's static skips finished rows
    )


def run(args: argparse.Namespace) -> list[dict]:
    import torch
    from cbbench.harness.telemetry.gpu import GpuSampler

    cuda = args.device.startswith("cuda") and torch.cuda.is_available()
    if not cuda and not (args.dry_run and args.device == "cpu"):
        raise CbbenchError(f"device {args.device!r}: this check needs CUDA (none here)")
    from cbbench.reference_engine.sim.simulate import replay

    rows = []
    for w in rp.WORKLOADS:
        nvml: dict[str, dict] = {}

        def replay_sampled(reqs, cfg, _nvml=nvml, **kw):
            sampler = GpuSampler(interval_s=0.1)
            sampler.start(time.monotonic_ns(), lambda _s: None)
            try:
                return replay(reqs, replace(cfg, device=args.device), **kw)
            finally:
                sampler.stop()
                _nvml[cfg.scheduler] = sampler.summary()

        row = rp.run_pair(w, gpu_setting(args, w), replay_fn=replay_sampled)
        for scheduler in ("static", "continuous"):
            res = row[scheduler]
            util = (nvml[scheduler].get("gpu_util") or {}).get("mean")
            rows.append({
                "workload": w, "scheduler": scheduler,
                "output_tok_s": res["output_throughput"],
                "slot_utilization": res["slot_utilization"],
                "busy_fraction": res["busy_fraction"],
                "nvml_gpu_util_mean": util,
                "conditions": row["conditions"],
            })  # fmt: skip
            print(f"{w:<12} {scheduler:<10} {res['output_throughput']:9.1f} tok/s  "
                  f"slot util {res['slot_utilization']:.0%}  NVML util {util}", flush=True)  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        rows = run(args)
    except CbbenchError as exc:
        print(f"reproduce_gpu: error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
