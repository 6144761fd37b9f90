"""One-command GPU check (issue 51 #2): NVML's start-up stays out of a run's measured window.

    python -m tests.benchmarks.gpu.t0_check [--out DIR]

On a machine with an NVIDIA GPU, two 24-request closed-loop runs (concurrency 4) against the
scripted fake server on loopback, GPU sampling (NVML) off and on, side by side: prints the
first send after t0 and the reported requests/s against count / (last end - first send) for
each. NVML's init took 70-170 ms inside the window before t0 moved after the samplers.
Exits 2 without NVML (one line; `--dry-run` runs on a CPU), 1 when there is no GPU sample, or when the first send is more than 5 ms after t0 or
the requests/s differ by more than 3 % with NVML on.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from cbbench.harness.cli import main as cbbench
from cbbench.harness.servers.fake_server import Behavior, FakeServerConfig, ThreadedServer


def one(url: str, out: Path, gpu: bool) -> dict:
    argv = ["bench", "--base-url", url, "--out", str(out), "--no-live", "--workload"]
    argv += ["seed-demo", "--num-requests", "24", "--concurrency", "4", "--no-server-metrics"]
    if not gpu:
        argv.append("--no-gpu-metrics")
    assert cbbench(argv) == 0, f"bench failed: {out}"
    rows = [json.loads(x) for x in (out / "requests.jsonl").open()]
    meta = json.loads((out / "run.json").read_text())
    first = min(r["sent_s"] for r in rows)
    last = max(r["end_s"] for r in rows)
    samples = [json.loads(x) for x in (out / "timeseries.jsonl").open()]
    return {
        "gpu_sampling": gpu,
        "first_send_ms": first * 1e3,
        "rps": meta["summary"]["request_throughput"],
        "rps_from_sends": len(rows) / (last - first),
        "gpu_samples": sum(s.get("source") == "gpu" for s in samples),
    }


def nvml_unavailable() -> str | None:
    """Why NVML cannot sample here (None when it can)."""
    from cbbench.harness.telemetry.gpu import GpuSampler

    sampler = GpuSampler(interval_s=1.0)
    sampler.start(time.monotonic_ns(), lambda _s: None)
    sampler.stop()
    return sampler.unavailable_reason


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="folder for the two run folders")
    ap.add_argument("--dry-run", action="store_true",
                    help="run both runs without a GPU; judge only that they ran (run_all.py)")  # fmt: skip
    args = ap.parse_args(argv)
    reason = nvml_unavailable()
    if reason is not None and not args.dry_run:
        print(f"t0_check: needs an NVIDIA GPU: {reason} (--dry-run: the CPU path)", file=sys.stderr)
        return 2
    root = args.out or Path(tempfile.mkdtemp(prefix="t0_check_"))
    server = ThreadedServer(FakeServerConfig(Behavior(ttft_s=0.005, itl_s=0.004)))
    try:
        rows = [one(server.url, root / f"gpu-{g}", g) for g in (False, True)]
    finally:
        server.stop()
    for r in rows:
        print(
            f"gpu sampling {'on ' if r['gpu_sampling'] else 'off'}: first send "
            f"{r['first_send_ms']:.2f} ms after t0; {r['rps']:.2f} req/s reported, "
            f"{r['rps_from_sends']:.2f} from the sends ({r['rps'] / r['rps_from_sends']:.4f}); "
            f"{r['gpu_samples']} GPU samples"
        )
    (root / "t0_check.json").write_text(json.dumps(rows, indent=2))
    on = rows[1]
    ok = (
        on["gpu_samples"] > 0
        and on["first_send_ms"] <= 5.0
        and abs(on["rps"] / on["rps_from_sends"] - 1) <= 0.03
    )
    if args.dry_run:  # no GPU samples expected: the two runs ran and were read back
        ok = all(r["rps"] > 0 for r in rows)
    print("PASS" if ok else "FAIL", f"({root / 't0_check.json'})" + (" dry run" * args.dry_run))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
