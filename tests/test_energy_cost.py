"""Energy and cost per token: the powercap (RAPL) sampler on a fake sysfs tree, a bench run
over HTTP with a fake NVML (the only fake, at the NVML boundary, as in test_telemetry_gpu)
and `--cost-per-hour`, then the report, the gate and the flags' errors."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cbbench.harness.gate.judge import run_gate
from cbbench.harness.gate.policy import Policy, Rule
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.report import build_report
from cbbench.harness.results.efficiency import efficiency
from cbbench.harness.results.run_folder import load_run
from cbbench.harness.servers.fake_server import Behavior, FakeServerConfig, ThreadedServer
from cbbench.harness.telemetry.gpu import GpuSampler
from cbbench.harness.telemetry.powercap import PowercapSampler
from cbbench.harness.telemetry.price import PriceSampler
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console

from tests.test_telemetry_gpu import fake_nvml

CLI = [sys.executable, "-m", "cbbench.harness.cli"]
RANGE_UJ = 262_143_328_850  # a real package's max_energy_range_uj


def powercap_tree(root: Path, energy_uj: dict[str, int]) -> Path:
    """intel-rapl:N zones (and a core sub-zone that must not be added again)."""
    for zone, uj in energy_uj.items():
        d = root / zone
        d.mkdir(parents=True)
        (d / "name").write_text("core\n" if zone.count(":") == 2 else f"package-{zone[-1]}\n")
        (d / "energy_uj").write_text(f"{uj}\n")
        (d / "max_energy_range_uj").write_text(f"{RANGE_UJ}\n")
    return root


def set_uj(root: Path, zone: str, uj: int) -> None:
    (root / zone / "energy_uj").write_text(f"{uj}\n")


def test_powercap_adds_the_packages_and_unwraps_the_counter(tmp_path):
    root = powercap_tree(
        tmp_path,
        {"intel-rapl:0": 1_000_000, "intel-rapl:0:0": 0, "intel-rapl:1": RANGE_UJ - 5_000_000},
    )
    samples: list[dict] = []
    s = PowercapSampler(interval_s=0.02, root=root)
    s.start(time.monotonic_ns(), samples.append)
    set_uj(root, "intel-rapl:0", 31_000_000)  # +30 J
    set_uj(root, "intel-rapl:0:0", 999_000_000)  # inside package-0: not counted again
    time.sleep(0.1)
    set_uj(root, "intel-rapl:1", 15_000_000)  # wrapped: +5 J to the top, +15 J after
    time.sleep(0.05)
    s.stop()
    out = s.summary()
    assert out["available"] is True
    assert out["zones"] == pytest.approx({"package-0": 30.0, "package-1": 20.0})
    assert out["energy_j"] == pytest.approx(50.0)
    assert out["power_w"] > 0 and out["window_s"] > 0
    assert samples and all(x["source"] == "powercap" for x in samples)


def test_powercap_absent_or_unreadable_says_why(tmp_path):
    s = PowercapSampler(root=tmp_path / "none")
    s.start(time.monotonic_ns(), lambda _x: None)
    s.stop()
    assert s.summary() == {"available": False, "reason": f"no RAPL zone under {tmp_path}/none"}
    (tmp_path / "intel-rapl:0" / "energy_uj").mkdir(parents=True)  # as unreadable as 0400
    s = PowercapSampler(root=tmp_path)
    s.start(time.monotonic_ns(), lambda _x: None)
    s.stop()
    assert "intel-rapl:0/energy_uj is not readable" in s.summary()["reason"]


def summary_with(telemetry: dict) -> dict:
    return {
        "duration_s": 10.0,
        "counts": {"completed": 20},
        "total_output_tokens": 4000,
        "telemetry": telemetry,
    }


def test_efficiency_prefers_nvml_then_powercap_else_a_note():
    gpu = {"available": True, "energy_j": 2000.0}
    cpu = {"available": True, "energy_j": 500.0}
    e = efficiency(summary_with({"gpu": gpu, "powercap": cpu}))["energy"]
    assert e["source"] == "nvml" and e["j_per_request"] == 100.0 and e["output_tokens_per_j"] == 2
    e = efficiency(
        summary_with({"gpu": {"available": False, "reason": "no driver"}, "powercap": cpu})
    )["energy"]
    assert e["source"] == "powercap" and e["j_per_request"] == 25.0
    e = efficiency(
        summary_with(
            {
                "gpu": {"available": False, "reason": "no NVIDIA driver (x)"},
                "powercap": {
                    "available": False,
                    "reason": "no RAPL zone under /sys/class/powercap",
                },
            }
        )  # fmt: skip
    )["energy"]
    assert e == {
        "available": False,
        "note": "no power reading (NVML: no NVIDIA driver (x); "
        "powercap: no RAPL zone under /sys/class/powercap)",
    }
    cost = efficiency(summary_with({"price": {"cost_per_hour": 3.6}}))["cost"]
    assert cost["run_usd"] == pytest.approx(0.01)
    assert cost["usd_per_1m_output_tokens"] == pytest.approx(0.01 / 4000 * 1e6)
    assert cost["usd_per_request"] == pytest.approx(0.0005)


def bench(out: Path, url: str, price: list[float], nvml_power_mw: tuple[float, ...]) -> Path:
    wl = Workload(name="energy", seed=0, requests=tuple(RequestSpec(i, 16, 8) for i in range(24)))
    cfg = BenchConfig(
        base_url=url, workload=wl, concurrency=4, out_dir=str(out), live=False, timeout_s=30.0
    )
    nvml = fake_nvml(devices=len(nvml_power_mw), power_mw=nvml_power_mw)
    samplers = [GpuSampler(interval_s=0.02, nvml=nvml), PriceSampler(price)]
    run_bench(cfg, samplers, console=Console(file=io.StringIO(), width=200))
    return out


# serial: the gate's $/1M tokens baseline within 5 %, set by run durations
@pytest.mark.serial
def test_bench_reports_energy_and_cost_and_the_gate_judges_cost(tmp_path):
    server = ThreadedServer(FakeServerConfig(default=Behavior(ttft_s=0.02, itl_s=0.01)))
    try:
        base = bench(tmp_path / "base", server.url, [2.0, 1.5], (200_000.0, 300_000.0))
        cand = bench(tmp_path / "cand", server.url, [7.0], (200_000.0,))
    finally:
        server.stop()
    meta = json.loads((base / "run.json").read_text())
    s = meta["summary"]
    e, cost = s["efficiency"]["energy"], s["efficiency"]["cost"]
    joules = s["telemetry"]["gpu"]["energy_j"]
    assert e["source"] == "nvml" and e["energy_j"] == joules > 0
    assert 500 * 0.1 < joules < 500 * 30  # 500 W over the run (0.1 s to 30 s)
    assert e["j_per_request"] == pytest.approx(joules / s["counts"]["completed"])
    assert e["output_tokens_per_j"] == pytest.approx(s["total_output_tokens"] / joules)
    assert s["counts"]["completed"] == 24 and s["total_output_tokens"] == 24 * 8
    # cost per 1M tokens = cost per hour x duration / tokens x 10^6
    expected = 3.5 * s["duration_s"] / 3600 / s["total_output_tokens"] * 1e6
    assert cost["cost_per_hour"] == 3.5
    assert cost["usd_per_1m_output_tokens"] == pytest.approx(expected, rel=1e-12)
    assert cost["usd_per_request"] == pytest.approx(3.5 * s["duration_s"] / 3600 / 24)
    report = build_report([str(base), str(cand)])
    html, md = report.html(), report.markdown()
    for text in (html, md):
        assert "$/1M output tok" in text and "output tok/J" in text
    assert f"{cost['usd_per_1m_output_tokens']:,.2f}" in md
    # the gate: the candidate's price is 2x, its cost per token about 2x
    runs = load_run(base), load_run(cand)
    policy = Policy(rules=(Rule("cost_per_1m_tokens", "max_increase", 0.10),), min_requests=10)
    r = run_gate(*runs, policy).results[0]
    assert r.verdict == "fail" and 1.4 < r.estimate < 3.0
    assert r.baseline == pytest.approx(expected, rel=0.05)
    ok = Policy(rules=(Rule("cost_per_1m_tokens", "max_increase", 3.0),), min_requests=10)
    assert run_gate(*runs, ok).results[0].verdict == "pass"


def test_cost_flag_and_gate_without_a_price_are_one_clear_error(tmp_path):
    p = subprocess.run(
        [*CLI, "bench", "--base-url", "http://127.0.0.1:1", "--cost-per-hour", "two"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "--cost-per-hour: expected a price per hour such as 2.5" in p.stderr
    server = ThreadedServer(FakeServerConfig())
    try:
        wl = Workload(
            name="energy", seed=0, requests=tuple(RequestSpec(i, 4, 2) for i in range(12))
        )
        cfg = BenchConfig(base_url=server.url, workload=wl, out_dir=str(tmp_path / "r"), live=False)
        run_bench(cfg, [], console=Console(file=io.StringIO()))
    finally:
        server.stop()
    policy = Policy(rules=(Rule("cost_per_1m_tokens", "max", 1.0),), min_requests=5)
    run = load_run(tmp_path / "r")
    with pytest.raises(
        Exception, match="the baseline run has no price .run it with --cost-per-hour"
    ):
        run_gate(run, run, policy)


def test_bench_cli_carries_the_price_into_the_run(tmp_path):
    from cbbench.harness.cli import main as cli_main

    server = ThreadedServer(FakeServerConfig(default=Behavior(ttft_s=0.01)))
    try:
        argv = ["bench", "--base-url", server.url, "--workload", "seed-demo", "--no-live"]
        argv += ["--out", str(tmp_path / "run"), "--cost-per-hour", "1.25,0.75"]
        assert cli_main(argv) == 0
    finally:
        server.stop()
    s = json.loads((tmp_path / "run" / "run.json").read_text())["summary"]
    assert s["telemetry"]["price"] == {"cost_per_hour": 2.0, "per_replica": [1.25, 0.75]}
    cost = s["efficiency"]["cost"]
    expected = 2.0 * s["duration_s"] / 3600 / s["total_output_tokens"] * 1e6
    assert cost["usd_per_1m_output_tokens"] == pytest.approx(expected, rel=1e-12)
    energy = s["efficiency"]["energy"]
    if energy["available"]:  # a host with an NVIDIA driver or a readable powercap
        assert energy["source"] in ("nvml", "powercap") and energy["output_tokens_per_j"] > 0
    else:
        assert energy["note"].startswith("no power reading (NVML: ")
