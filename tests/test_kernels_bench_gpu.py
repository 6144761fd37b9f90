"""The GPU check script's parts that run without a GPU: its refusal without CUDA, argument
parsing, the peak table, byte counts, the correctness grid and the engine check under the
Triton interpreter, and the JSON + summary it writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.benchmarks.gpu.kernels_report import decode_bytes, peak_bandwidth, write_results


def interpreted(code: str) -> object:
    """Run `code` (which prints one JSON value) in a fresh interpreter under TRITON_INTERPRET=1:
    triton.jit reads the flag when triton and the kernel modules are first imported, and an
    earlier test in this process may have imported them compiled."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_refuses_loudly_without_cuda(tmp_path, capsys):
    from tests.benchmarks.gpu.kernels_check import main

    assert not torch.cuda.is_available()
    assert main(["--out", str(tmp_path / "o")]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_parse_args():
    from tests.benchmarks.gpu.kernels_check import parse_args

    args = parse_args(["--out", "x", "--dtypes", "bfloat16", "--batches", "1,64", "--quick"])
    assert args.dtypes == [torch.bfloat16] and args.batches == [1, 64] and args.quick
    assert args.contexts[0] == 512 and args.contexts[-1] == 32768
    with pytest.raises(SystemExit) as exc:
        parse_args(["--out", "x", "--dtypes", "float8"])
    assert exc.value.code == 2


@pytest.mark.parametrize(
    "name,peak",
    [
        ("NVIDIA H100 80GB HBM3", 3.35e12),
        ("NVIDIA H100 PCIe", 2.0e12),
        ("NVIDIA H200", 4.8e12),
        ("NVIDIA A100-SXM4-80GB", 2.039e12),
        ("NVIDIA GeForce GTX 1080", None),
    ],
)
def test_peak_bandwidth_table(name, peak):
    assert peak_bandwidth(name) == peak


def test_decode_bytes_at_the_goal_point():
    # batch 64, 4k context, 8 KV heads x 128, bf16: K+V = 1 GiB; q and out 1 MiB
    assert decode_bytes(64, 4096, 32, 8, 128, 2) == 2**30 + 2 * 64 * 32 * 128 * 2


# slow (suite budget, 16 s): the kernels' correctness against the oracle stays in the default run
# (test_kernels_triton.py::test_paged_attention_matches_oracle and the cache tests there)
@pytest.mark.slow
def test_correctness_grid_and_report_on_cpu(tmp_path):
    from tests.benchmarks.gpu.kernels_check import GOAL

    checks = interpreted(
        "import json, torch\n"
        "from tests.benchmarks.gpu.kernels_check import correctness_grid\n"
        "cs = correctness_grid(torch.device('cpu'), [torch.float32], quick=True)\n"
        "print(json.dumps([c.__dict__ for c in cs]))"
    )
    assert isinstance(checks, list)
    assert len(checks) == 9 and all(c["passed"] for c in checks), checks  # 4 x 2 kernels + cache
    assert checks[-1]["name"] == "reshape_and_cache" and checks[-1]["max_abs_err"] == 0.0
    report = {
        "device": "cpu-test",
        "peak_gbps": 3350.0,
        "peak_source": "name table",
        "measured_copy_gbps": 2900.0,
        "correctness": checks
        + [{"name": "x", "dtype": "bfloat16", "max_abs_err": 0.5, "tol": 0.02, "passed": False}],
        "decode_shape": {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "block_size": 16},
        "decode": [
            {
                "batch": 64,
                "context": 4096,
                "triton_gbps": 2800.0,
                "triton_frac_peak": 0.836,
                "sdpa_dense_gbps": 2500.0,
                "sdpa_dense_frac_peak": 0.746,
            }  # fmt: skip
        ],
        "goal": dict(GOAL, measured=0.836, met=True),
    }
    text = write_results(tmp_path / "out", report)
    assert json.loads((tmp_path / "out" / "bench_gpu.json").read_text()) == report
    assert (tmp_path / "out" / "summary.txt").read_text() == text
    assert "correctness: 9/10 passed" in text and "FAIL x bfloat16" in text
    assert "2800 (84%)" in text and "-> MET" in text
    assert "heads 32 q / 8 kv x 128, block 16" in text


# slow (suite budget, 14 s): the engine on the Triton path, token-identical to torch, stays in
# the default run (test_engine_model_runner.py::test_model_over_the_triton_backend_matches_torch)
@pytest.mark.slow
def test_engine_check_runs_the_engine_on_triton_kernels():
    """The engine end to end on the Triton path (interpreted on CPU), token-identical to torch;
    a 16-token step budget makes the 13- and 42-token prompts (beside an 8-token one) prefill
    in chunks over their cached prefix, batched with the other sequences' decodes."""
    result = interpreted(
        "import json, os\n"
        "from tests.benchmarks.gpu.engine_check import engine_check\n"
        "r = engine_check('cpu', 'tiny', backend='triton', num_requests=3, max_tokens=6,\n"
        "                 max_prompt=40, token_budget=16)\n"
        "r['interpret_env'] = os.environ['TRITON_INTERPRET']\n"
        "print(json.dumps(r, default=str))"
    )
    assert isinstance(result, dict)
    checked, torch_run = result["checked"], result["torch"]
    assert checked["backend"] == "triton" and torch_run["backend"] == "torch"
    assert checked["steps"] == torch_run["steps"] > 6  # chunking took extra steps
    assert checked["attention_calls"] == 2 * checked["steps"]  # 2 layers, one call each
    assert result["identical_streams"] == "3/3" and result["passed"]
    assert result["interpret_env"] == "1"
