"""NVML sampler logic with a fake `pynvml` injected at the NVML boundary (the only fake)."""

from __future__ import annotations

import logging
import time
import types

import pytest
from cbbench.harness.errors import CbbenchError
from cbbench.harness.telemetry.gpu import SUMMARY_FIELDS, GpuSampler, trapezoid_energy_j

GIB = 1024**3


class FakeNVMLError(Exception):
    pass


class FakeNotSupported(FakeNVMLError):
    pass


def fake_nvml(
    devices: int = 2,
    init_error: str | None = None,
    no_power: tuple[int, ...] = (),
    power_mw: tuple[float, ...] = (200_000.0, 300_000.0),
) -> types.ModuleType:
    """A module with pynvml's names; device i reports fixed, distinguishable readings."""
    m = types.ModuleType("pynvml")
    m.NVMLError = FakeNVMLError
    m.NVML_CLOCK_SM = 1
    m.calls = {"init": 0, "shutdown": 0}

    def init() -> None:
        if init_error:
            raise FakeNVMLError(init_error)
        m.calls["init"] += 1

    def shutdown() -> None:
        m.calls["shutdown"] += 1

    def power(h: int) -> float:
        if h in no_power:
            raise FakeNotSupported("Not Supported")
        return power_mw[h]

    def clock(h: int, kind: int) -> int:
        assert kind == m.NVML_CLOCK_SM
        return 1980 - 100 * h

    m.nvmlInit = init
    m.nvmlShutdown = shutdown
    m.nvmlDeviceGetCount = lambda: devices
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: f"NVIDIA Fake {h}".encode()
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=80 + h, memory=40 + h)
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        used=(10 + h) * GIB, total=80 * GIB, free=(70 - h) * GIB
    )
    m.nvmlDeviceGetPowerUsage = power
    m.nvmlDeviceGetClockInfo = clock
    return m


def sample_for(sampler: GpuSampler, ticks: int) -> list[dict]:
    samples: list[dict] = []
    sampler.start(time.monotonic_ns(), samples.append)
    deadline = time.monotonic() + 10
    while len(samples) < ticks * max(1, len(sampler.device_names)) and time.monotonic() < deadline:
        time.sleep(0.005)
    sampler.stop()
    return samples


def test_samples_every_device_with_exact_fields() -> None:
    nvml = fake_nvml()
    sampler = GpuSampler(interval_s=0.01, nvml=nvml)
    samples = sample_for(sampler, ticks=3)
    assert {s["index"] for s in samples} == {0, 1}
    s1 = next(s for s in samples if s["index"] == 1)
    assert s1 == {
        "t_s": s1["t_s"],
        "source": "gpu",
        "index": 1,
        "util_gpu": 81.0,
        "util_mem": 41.0,
        "mem_used_bytes": 11 * GIB,
        "mem_total_bytes": 80 * GIB,
        "power_w": 300.0,
        "sm_clock_mhz": 1880,
    }
    summary = sampler.summary()
    assert summary["available"] is True and summary["unavailable"] == []
    assert summary["devices"] == {"0": "NVIDIA Fake 0", "1": "NVIDIA Fake 1"}
    assert summary["gpu_util"] == {"mean": 80.5, "max": 81.0}
    assert summary["gpu_mem_max_bytes"] == 11 * GIB
    assert summary["samples"] == len(samples) and summary["failures"] == 0
    live = sampler.latest()
    assert live["devices"] == 2 and live["util_gpu"] == 80.5 and live["power_w"] == 500.0
    assert nvml.calls == {"init": 1, "shutdown": 1}


def test_energy_is_the_trapezoid_over_each_devices_power() -> None:
    assert trapezoid_energy_j([(0.0, 100.0), (1.0, 200.0), (3.0, 200.0)]) == 550.0
    assert trapezoid_energy_j([(2.0, 50.0)]) is None
    sampler = GpuSampler(interval_s=0.01, nvml=fake_nvml())
    samples = sample_for(sampler, ticks=4)
    summary = sampler.summary()
    expected = 0.0
    for index, watts in ((0, 200.0), (1, 300.0)):
        ts = [s["t_s"] for s in samples if s["index"] == index]
        dev = summary["per_device"][str(index)]
        assert dev["energy_j"] == pytest.approx(watts * (max(ts) - min(ts)))
        expected += dev["energy_j"]
    assert summary["energy_j"] == pytest.approx(expected) and expected > 0


def test_chosen_gpus_only_and_unsupported_power_stays_absent() -> None:
    sampler = GpuSampler(interval_s=0.01, gpus=[1], nvml=fake_nvml(devices=3, no_power=(1,)))
    samples = sample_for(sampler, ticks=2)
    assert samples and {s["index"] for s in samples} == {1}
    assert all("power_w" not in s and s["util_gpu"] == 81.0 for s in samples)
    summary = sampler.summary()
    assert summary["unavailable"] == ["power_w", "energy_j"]
    assert "power_w" not in summary and "energy_j" not in summary
    assert summary["failures"] == len(samples)
    assert summary["last_error"] == "device 1 power: Not Supported"


def test_unknown_gpu_index_is_a_user_error() -> None:
    nvml = fake_nvml(devices=2)
    with pytest.raises(CbbenchError, match="--gpus: no NVIDIA device 5"):
        GpuSampler(gpus=[0, 5], nvml=nvml).start(time.monotonic_ns(), lambda s: None)
    assert nvml.calls["shutdown"] == 1


@pytest.mark.parametrize(
    ("nvml", "reason"),
    [
        (fake_nvml(init_error="Driver Not Loaded"), "no NVIDIA driver (Driver Not Loaded)"),
        (fake_nvml(devices=0), "no NVIDIA GPU (NVML reports 0 devices)"),
    ],
)
def test_no_driver_says_so_once_and_records_nothing(nvml, reason, caplog) -> None:
    samples: list[dict] = []
    sampler = GpuSampler(interval_s=0.01, nvml=nvml)
    with caplog.at_level(logging.WARNING):
        sampler.start(time.monotonic_ns(), samples.append)
        time.sleep(0.05)
        sampler.stop()
        sampler.stop()
    assert samples == [] and sampler.latest() == {}
    # no driver is a machine without a GPU: not a warning on every run (issue 51), the
    # summary says it once; a driver with no GPU it can see is worth one
    said = [r.getMessage() for r in caplog.records]
    quiet = reason.startswith("no NVIDIA driver")
    assert said == ([] if quiet else [f"gpu metrics: {reason}; GPU metrics are not recorded"])
    summary = sampler.summary()
    assert summary == {"available": False, "reason": reason, "unavailable": list(SUMMARY_FIELDS)}


def test_real_pynvml_records_only_when_a_driver_answers() -> None:
    """The real NVML library: on a machine without a driver nothing is recorded, no crash."""
    samples: list[dict] = []
    sampler = GpuSampler(interval_s=0.02)
    sampler.start(time.monotonic_ns(), samples.append)
    time.sleep(0.1)
    sampler.stop()
    summary = sampler.summary()
    if summary["available"]:
        assert samples and all(s["source"] == "gpu" for s in samples)
    else:
        assert samples == [] and summary["reason"]
        assert summary["unavailable"] == list(SUMMARY_FIELDS)


def test_gpu_check_exit_code_follows_nvml(tmp_path) -> None:
    """`python -m tests.benchmarks.gpu.telemetry_check`: non-zero exactly when there is no GPU."""
    import json

    from tests.benchmarks.gpu.telemetry_check import main

    rc = main(["--out", str(tmp_path), "--seconds", "0.2"])
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    if report["summary"]["available"]:
        assert rc == 0 and report["samples"] and report["load"]["matmuls"] > 0
    else:
        assert rc == 2 and report["samples"] == [] and report["load"] is None  # run_all: needs-cuda
        assert report["summary"]["reason"].startswith("no NVIDIA")


def test_summary_reports_the_sampler_threads_own_cpu() -> None:
    sampler = GpuSampler(interval_s=0.01, nvml=fake_nvml())
    sample_for(sampler, ticks=2)
    cpu = sampler.summary()["cpu_s"]
    assert isinstance(cpu, float) and cpu > 0


def test_validate_rejects_a_missing_index_before_the_run() -> None:
    nvml = fake_nvml(devices=2)
    GpuSampler(gpus=[1], nvml=nvml).validate()
    with pytest.raises(CbbenchError, match="--gpus: no NVIDIA device 2 "):
        GpuSampler(gpus=[2], nvml=nvml).validate()
    assert nvml.calls == {"init": 2, "shutdown": 2}
    GpuSampler(gpus=[7], nvml=fake_nvml(init_error="Driver Not Loaded")).validate()  # no driver


def test_nvml_error_while_opening_devices_is_unavailable_not_a_crash() -> None:
    nvml = fake_nvml()

    def broken(i: int) -> int:
        raise FakeNVMLError("GPU is lost")

    nvml.nvmlDeviceGetHandleByIndex = broken
    samples: list[dict] = []
    sampler = GpuSampler(interval_s=0.01, nvml=nvml)
    sampler.start(time.monotonic_ns(), samples.append)
    sampler.stop()
    assert samples == [] and nvml.calls["shutdown"] == 1
    assert sampler.summary()["reason"] == "NVML could not open the GPUs (GPU is lost)"
