"""On a CUDA machine: the GPU check script end to end (`pytest -m gpu`). It runs in a fresh
interpreter without TRITON_INTERPRET, since test_kernels_triton imports the kernels
interpreted in this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch


def _run_bench_gpu(
    out_dir, *flags: str, module: str = "tests.benchmarks.gpu.engine_check"
) -> dict:
    assert torch.cuda.is_available(), "tests marked gpu need a CUDA device"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", module, "--out", str(out_dir), *flags],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((out_dir / "bench_gpu.json").read_text())


@pytest.mark.gpu
def test_bench_gpu_quick(tmp_path):
    report = _run_bench_gpu(tmp_path, "--quick")
    assert report["correctness"] and all(c["passed"] for c in report["correctness"])
    assert report["engine"]["checked"]["backend"] == "triton" and report["engine"]["passed"]
    assert report["decode"][0]["triton_gbps"] > 0


@pytest.mark.gpu
def test_bench_gpu_kernels_only(tmp_path):
    report = _run_bench_gpu(tmp_path, "--quick", module="tests.benchmarks.gpu.kernels_check")
    assert report["correctness"] and "engine" not in report


@pytest.mark.gpu
@pytest.mark.slow
def test_bench_gpu_full_grid(tmp_path):
    report = _run_bench_gpu(tmp_path)
    assert len(report["correctness"]) == 3 * (9 * 2 + 1)  # dtypes x (9 cases x 2 kernels + cache)
    assert all(c["passed"] for c in report["correctness"])
    assert {(r["batch"], r["context"]) for r in report["decode"]} >= {(64, 4096)}
