"""The GPU checks' driver (tests/benchmarks/gpu/run_all.py) in its CPU dry run, so that the
scripts cannot rot silently between the rare sessions that are lent a GPU: every check
starts, parses its arguments, imports and builds its tiny model here, and where it needs
CUDA it refuses in one line with exit 2, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.benchmarks.gpu import run_all

GPU_DIR = Path(run_all.__file__).parent
HELPERS = {"run_all", "kernels_report", "graphs_check"}  # run by kernels_check, engine_check


def test_every_check_script_is_in_the_driver():
    scripts = {p.stem for p in GPU_DIR.glob("*.py")} - HELPERS
    assert scripts == {c.module for c in run_all.CHECKS}
    names = [c.name for c in run_all.CHECKS]
    assert len(set(names)) == len(names)
    # sized for one 10-minute device call: the budget bounds the sum, and every check's own
    # bound fits in it
    assert all(c.timeout_s <= 540 for c in run_all.CHECKS)


def test_classify():
    assert run_all.classify(0, "ok") == "pass"
    assert run_all.classify(2, "x: needs an NVIDIA GPU\n") == "needs-cuda"
    assert run_all.classify(2, "Traceback (most recent call last):\n  ...\n") == "fail"
    assert run_all.classify(None, "") == "timeout"
    assert run_all.classify(1, "FAIL") == "fail"


def test_budget_and_timeout_bound_each_check(tmp_path):
    from_run = next(c for c in run_all.CHECKS if c.name == "from_run")
    assert run_all.run_serial([from_run], tmp_path, True, False, budget=5) == [
        run_all.Outcome("from_run", "skipped", None, 0.0, "budget spent")
    ]
    pd = next(c for c in run_all.CHECKS if c.name == "pd")
    o = run_all.run_check(pd, tmp_path, True, False, limit_s=0.1)  # torch not even imported
    assert o.status == "timeout" and o.rc is None and o.files == ["pd/log.txt"]


LIGHT = ["env", "kernels", "pd", "telemetry", "t0", "compile"]  # the default suite's share


def _dry_run(tmp_path: Path, only: list[str]) -> Path:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.benchmarks.gpu.run_all", "--out", str(out), "--dry-run",
         "--jobs", "3", "--only", ",".join(only)],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # the device tool returns at most 8 files
    assert sorted(p.name for p in out.iterdir()) == ["gpu-checks.tar.gz", "summary.json",
                                                     "summary.txt"]  # fmt: skip
    doc = json.loads((out / "summary.json").read_text())
    status = {c["name"]: c["status"] for c in doc["checks"]}
    refuse = {c.name for c in run_all.CHECKS if c.dry_may_refuse}
    assert status == {n: "needs-cuda" if n in refuse else "pass" for n in only}, proc.stdout
    assert (out / "summary.txt").read_text().startswith("GPU checks (dry run, CPU)")
    with tarfile.open(out / "gpu-checks.tar.gz") as tar:
        tar.extractall(tmp_path / "x", filter="data")
    root = tmp_path / "x" / "gpu-checks"
    for name in only:
        log = (root / name / "log.txt").read_text()
        assert "Traceback" not in log, log[-3000:]
    return root


@pytest.mark.timeout(420)
def test_dry_run_of_the_light_checks(tmp_path):
    """~12 s on 2 shared cores (3 side by side; torch's import dominates). With the GPU-mode
    test below, every check's imports and argument parsing run in the default suite."""
    root = _dry_run(tmp_path, LIGHT)
    env = json.loads((root / "env" / "env.json").read_text())
    assert [p["warmup"] for p in env["probes"]] == [False, True]
    assert all(p["ttft_first_s"] > 0 and p["warmup_s"] is None for p in env["probes"])  # CPU
    pd = json.loads((root / "pd" / "pd_check.json").read_text())
    assert [r["kv_cache_dtype"] for r in pd] == ["auto", "fp8"]
    assert all(r["identical"] == r["requests"] == 2 and r["leaked_blocks"] == 0 for r in pd)
    assert (root / "t0" / "t0_check.json").exists()


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_dry_run_of_the_heavy_checks(tmp_path):
    """The engine and its modes, static vs continuous, a served run fitted (~30 CPU s)."""
    root = _dry_run(tmp_path, [c.name for c in run_all.CHECKS if c.name not in LIGHT])
    dry = json.loads((root / "engine" / "dry_run.json").read_text())
    assert dry["engine"]["identical_streams"] == "3/3" and dry["modes"]["passed"]
    rows = json.loads((root / "reproduce" / "gpu-util.json").read_text())
    assert len(rows) == 6 and {r["scheduler"] for r in rows} == {"static", "continuous"}
    fits = sorted(p.name for p in (root / "from_run").glob("fit-*.json"))
    assert fits == ["fit-all.json", "fit-half.json"]


@pytest.mark.timeout(420)
def test_gpu_mode_on_a_cpu_refuses_in_one_line(tmp_path):
    """The GPU arguments here: every check that needs CUDA or NVML exits 2 with one line
    (classified needs-cuda: no traceback), and the driver's exit says not all passed."""
    need = ["kernels", "engine", "pd", "telemetry", "t0", "reproduce", "from_run"]
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.benchmarks.gpu.run_all", "--out", str(out), "--jobs", "4",
         "--only", ",".join(need)],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-4000:]
    doc = json.loads((out / "summary.json").read_text())
    assert {c["name"]: (c["status"], c["rc"]) for c in doc["checks"]} == {
        n: ("needs-cuda", 2) for n in need
    }, proc.stdout[-4000:]
    assert all("needs" in c["last_line"] or "CUDA" in c["last_line"] for c in doc["checks"])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dry_run_under_the_triton_interpreter(tmp_path):
    """--interpret: the kernels' correctness grid and the engine on the Triton kernels
    (TRITON_INTERPRET=1), tiny sizes."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.benchmarks.gpu.run_all", "--out", str(out), "--dry-run",
         "--interpret", "--only", "engine"],
        capture_output=True, text=True, timeout=580,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:]
    with tarfile.open(out / "gpu-checks.tar.gz") as tar:
        tar.extractall(tmp_path / "x", filter="data")
    dry = json.loads((tmp_path / "x/gpu-checks/engine/dry_run.json").read_text())
    assert dry["interpret"] and dry["engine"]["checked"]["backend"] == "triton"
    assert dry["correctness"] and all(c["passed"] for c in dry["correctness"])
