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


def main(argv: list[str] | None = None) -> None:
    global DRY_RUN
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", required=True)
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
        "bfloat16",
        "--check-run",
        str(out / "b"),
    ]
    cbbench("calibrate", *runs, "--out", str(out / "fit-half.json"))  # first halves -> whole
    cbbench("calibrate", *runs, "--holdout", "0", "--out", str(out / "fit-all.json"))  # A -> B
    cbbench("calibrate", "--check-run", str(out / "a1"), str(out / "a2"), str(out / "b"),
            "--fit", a.hardware, "--server-config", a.server_config, "--model", a.model,
            "--dtype", "bfloat16")  # the spec-sheet preset, unfitted  # fmt: skip


if __name__ == "__main__":
    main()
