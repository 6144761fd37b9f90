"""The GPU check of issue #53: a real vLLM server on GPUs as the black box.

Against a vLLM server already running (any model, any --tensor-parallel-size; started with
`--enable-per-request-metrics`, and `--enable-prompt-tokens-details` so that it says its
prefix-cache hits: the second A run resends the first's prompts), bench workload A at two
rates and workload B at another,
then: the fit from the first half of each A run predicting the whole runs (targets: means
within 5 %, p99 within 10 %), the fit of all of A predicting B, and the spec-sheet preset
predicting every run (target 15 %). Prints the tables; everything lands under OUT.

    vllm serve meta-llama/Llama-3.1-8B-Instruct --max-num-seqs 128 --max-num-batched-tokens 2048 \\
        --enable-per-request-metrics --enable-prompt-tokens-details --port 8000 &
    python -m tests.benchmarks.gpu.from_run_check --base-url http://127.0.0.1:8000 \\
        --model llama-3.1-8b --hardware h100 --server-config max_num_seqs=128,max_num_batched_tokens=2048 \\
        --out out/gpu-from-run [--rates 4,10 --check-rate 7 --num-requests 300]

`--model` is what the simulator prices (a preset, or the served model's config.json or
folder); the TP size goes in --server-config (tensor_parallel_size=N). No GPU is touched by
this script itself: it only talks HTTP to the server.

Without vLLM (the lent GPU machine's image has none), `--serve MODEL` starts the reference
engine's server (`cbbench serve`, continuous, --server-config's settings as its flags,
--dtype) on --serve-device and runs the same pipeline against it (run_all.py does, with
qwen2.5-0.5b on CUDA; its dry run with tiny on the CPU). `--dry-run` prints the commands.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

SPEC_A = {"prompt": {"dist": "lognormal", "median": 256, "sigma": 0.9, "min": 16, "max": 4096},
          "output": {"dist": "lognormal", "median": 160, "sigma": 0.8, "min": 8, "max": 1024}}  # fmt: skip
SPEC_B = {"prompt": {"dist": "uniform", "min": 32, "max": 2048},
          "output": {"dist": "uniform", "min": 16, "max": 512}}  # fmt: skip


DRY_RUN = False  # --dry-run: print the commands, run none (run_all.py: no vLLM in the image)


def cbbench(*args: str) -> None:
    print("$ cbbench " + " ".join(args), flush=True)
    if DRY_RUN:
        return
    subprocess.run([sys.executable, "-m", "cbbench.harness.cli", *args], check=True, timeout=3600)


def main(argv: list[str] | None = None) -> int:
    global DRY_RUN
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", default=None, help="the server (or --serve)")
    ap.add_argument("--serve", default=None, metavar="MODEL",
                    help="start the reference engine's server on --serve-device instead (the "
                    "GPU machine has no vLLM): its --server-config flags are passed to it")  # fmt: skip
    ap.add_argument("--serve-device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16",
                    help="the served weights' dtype (passed to --serve and to calibrate)")  # fmt: skip
    ap.add_argument("--model", required=True)
    ap.add_argument("--hardware", required=True, help="the spec-sheet preset to check (h100, ...)")
    ap.add_argument("--server-config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rates", default="4,10")
    ap.add_argument("--check-rate", default="7")
    ap.add_argument("--num-requests", default="300")
    ap.add_argument("--dry-run", action="store_true", help="write the specs, print the commands")
    a = ap.parse_args(argv)
    DRY_RUN = a.dry_run
    if (a.base_url is None) == (a.serve is None):
        ap.error("give one of --base-url and --serve")
    if a.serve is None or DRY_RUN:
        a.base_url = a.base_url or "http://127.0.0.1:0"
        pipeline(a)
        return 0
    import torch
    from cbbench.harness.errors import CbbenchError
    from cbbench.harness.servers.launcher import launch_server, serve_command

    if a.serve_device.startswith("cuda") and not torch.cuda.is_available():
        print(f"from_run_check: --serve-device {a.serve_device}: no CUDA device here "
              "(--serve-device cpu, or --dry-run)", file=sys.stderr)  # fmt: skip
        return 2

    flags = []
    for kv in a.server_config.split(","):  # max_num_seqs=32 -> --max-num-seqs 32
        k, _, v = kv.partition("=")
        flags += [f"--{k.strip().replace('_', '-')}", v.strip()]
    cmd = serve_command(a.serve, "continuous", a.serve_device, [*flags, "--dtype", a.dtype])
    try:
        with launch_server(cmd, ready_timeout_s=180.0, name="cbbench serve") as server:
            a.base_url = server.base_url
            pipeline(a)
    except (CbbenchError, subprocess.CalledProcessError) as exc:
        print(f"from_run_check: FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


def pipeline(a: argparse.Namespace) -> None:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, spec in (("a", SPEC_A), ("b", SPEC_B)):
        (out / f"spec-{name}.json").write_text(json.dumps({"num_requests": int(a.num_requests),
                                                           **spec}))  # fmt: skip
    common = ["--base-url", a.base_url, "--no-live", "--seed", "0", "--num-requests",
              a.num_requests]  # fmt: skip
    rates = a.rates.split(",")
    cbbench("bench", *common, "--workload", str(out / "spec-a.json"), "--rate", rates[0],
            "--out", str(out / "a1"))  # fmt: skip
    cbbench("bench", *common, "--workload", str(out / "spec-b.json"), "--rate", a.check_rate,
            "--out", str(out / "b"))  # fmt: skip
    cbbench("bench", *common, "--workload", str(out / "spec-a.json"), "--rate", rates[-1],
            "--out", str(out / "a2"))  # fmt: skip
    runs = [
        "--from-run",
        str(out / "a1"),
        str(out / "a2"),
        "--server-config",
        a.server_config,
        "--model",
        a.model,
        "--dtype",
        a.dtype,
        "--check-run",
        str(out / "b"),
    ]
    cbbench("calibrate", *runs, "--out", str(out / "fit-half.json"))  # first halves -> whole
    cbbench("calibrate", *runs, "--holdout", "0", "--out", str(out / "fit-all.json"))  # A -> B
    cbbench("calibrate", "--check-run", str(out / "a1"), str(out / "a2"), str(out / "b"),
            "--fit", a.hardware, "--server-config", a.server_config, "--model", a.model,
            "--dtype", a.dtype)  # the spec-sheet preset, unfitted  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
