"""The Triton kernels compile for real NVIDIA targets (down to cubin, no GPU needed).

The interpreter runs code the GPU compiler rejects (it accepted a plain-float global read
from a kernel that sm_80/sm_90 compilation refused), so this is the CPU check that the CUDA
path builds. A fresh interpreter without TRITON_INTERPRET and an empty Triton cache make
every run compile for real. Default run: bf16 on sm_90 (bf16 is the dtype whose native-dot
path the interpreter cannot execute); `-m slow`: every dtype on sm_80 and sm_90.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _compile(tmp_path, *flags: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    return subprocess.run(
        [sys.executable, "-m", "tests.benchmarks.gpu.compile_check", *flags],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )


@pytest.mark.timeout(960)  # the compile's own bound is 900 s
def test_bf16_kernels_compile_for_sm90(tmp_path):
    proc = _compile(tmp_path, "--arch", "90", "--dtypes", "bf16")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 5 and all(": ok," in line for line in lines), lines
    assert {line.split()[1] for line in lines} == {
        "decode", "decode-mha-d64", "merge", "prefill", "reshape_and_cache"
    }  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(960)
def test_all_kernels_compile_for_sm80_and_sm90(tmp_path):
    proc = _compile(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(proc.stdout.splitlines()) == 2 * 3 * 5


def test_refuses_under_the_interpreter(monkeypatch, capsys):
    from tests.benchmarks.gpu.compile_check import main

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert main([]) == 1
    assert "unset TRITON_INTERPRET" in capsys.readouterr().err
