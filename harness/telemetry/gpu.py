"""GPU sampler: NVML (`pynvml` from nvidia-ml-py) utilization, memory, power and SM clock.

One `timeseries.jsonl` sample per device per tick (`source: "gpu"`). Without an NVIDIA
driver the sampler says so once, records nothing and reports the GPU fields as unavailable:
absent, never zero. NVML is passed in as a module so tests can inject a fake at exactly
this boundary.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
import time
from collections.abc import Callable
from itertools import pairwise
from types import ModuleType

from cbbench.harness.errors import CbbenchError

NO_DRIVER = "no NVIDIA driver"
log = logging.getLogger(__name__)

# Per-sample fields; utilizations are NVML percentages (0-100).
GPU_FIELDS = (
    "util_gpu",
    "util_mem",
    "mem_used_bytes",
    "mem_total_bytes",
    "power_w",
    "sm_clock_mhz",
)
SUMMARY_FIELDS = (
    "gpu_util",
    "gpu_mem_util",
    "gpu_mem_max_bytes",
    "power_w",
    "energy_j",
    "sm_clock_mhz",
)


def _mean_max(vals: list[float]) -> dict | None:
    return {"mean": sum(vals) / len(vals), "max": max(vals)} if vals else None


def trapezoid_energy_j(points: list[tuple[float, float]]) -> float | None:
    """Energy (J) from (t_s, power_w) points by the trapezoid rule; None under two points."""
    if len(points) < 2:
        return None
    pts = sorted(points)
    return sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in pairwise(pts))


class GpuSampler:
    name = "gpu"

    def __init__(
        self,
        interval_s: float = 0.25,
        gpus: list[int] | None = None,
        nvml: ModuleType | None = None,
    ) -> None:
        assert interval_s > 0, "interval must be positive"
        self.interval_s = interval_s
        self.gpus = gpus
        self._nvml = nvml
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0_ns = 0
        self._sink: Callable[[dict], None] = lambda _s: None
        self._handles: dict[int, object] = {}
        self.device_names: dict[int, str] = {}
        self.unavailable_reason: str | None = None
        self._series: dict[int, list[dict]] = {}
        self._latest: dict[int, dict] = {}
        self.failures = 0
        self.last_error: str | None = None
        self.cpu_s: float | None = None

    # -- Sampler protocol -------------------------------------------------------------
    def start(self, t0_ns: int, sink: Callable[[dict], None]) -> None:
        assert self._thread is None, "a sampler starts once"
        self._t0_ns, self._sink = t0_ns, sink
        if not self._open():
            # no driver at all is a machine without a GPU: run.json says so once (telemetry
            # gpu.reason); a driver that fails is worth a warning
            quiet = (self.unavailable_reason or "").startswith(NO_DRIVER)
            (log.info if quiet else log.warning)(
                "gpu metrics: %s; GPU metrics are not recorded", self.unavailable_reason
            )
            return
        self._thread = threading.Thread(target=self._loop, name="cbbench-gpu-metrics")
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=5.0)
        if not self._thread.is_alive() and self._handles:
            self._handles = {}
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()

    def latest(self) -> dict:
        """The latest tick for the live view: mean utilization, summed memory and power."""
        with self._lock:
            latest = list(self._latest.values())
        if not latest:
            return {}
        out: dict = {}
        for key, how in (
            ("util_gpu", "mean"),
            ("util_mem", "mean"),
            ("mem_used_bytes", "sum"),
            ("mem_total_bytes", "sum"),
            ("power_w", "sum"),
        ):
            vals = [s[key] for s in latest if key in s]
            if vals:
                out[key] = sum(vals) / len(vals) if how == "mean" else sum(vals)
        out["devices"] = len(latest)
        return out

    def summary(self) -> dict:
        with self._lock:
            if self.unavailable_reason is not None:
                return {
                    "available": False,
                    "reason": self.unavailable_reason,
                    "unavailable": list(SUMMARY_FIELDS),
                }
            per_device = {str(i): self._device_summary(i, s) for i, s in self._series.items()}
            every = [s for series in self._series.values() for s in series]
            out: dict = {
                "available": True,
                "devices": {str(i): n for i, n in self.device_names.items()},
                "interval_s": self.interval_s,
                "samples": len(every),
                "failures": self.failures,
                "last_error": self.last_error,
                "cpu_s": self.cpu_s,
            }
            out.update(self._fields(every))
            energies = [d["energy_j"] for d in per_device.values() if "energy_j" in d]
            if energies:
                out["energy_j"] = sum(energies)
            out["per_device"] = per_device
            out["unavailable"] = [f for f in SUMMARY_FIELDS if f not in out]
            return out

    # -- internals --------------------------------------------------------------------
    @staticmethod
    def _fields(samples: list[dict]) -> dict:
        def col(k: str) -> list[float]:
            return [s[k] for s in samples if k in s]

        out: dict = {}
        for name, key in (("gpu_util", "util_gpu"), ("gpu_mem_util", "util_mem")):
            if (mm := _mean_max(col(key))) is not None:
                out[name] = mm
        if used := col("mem_used_bytes"):
            out["gpu_mem_max_bytes"] = max(used)
        if total := col("mem_total_bytes"):
            out["gpu_mem_total_bytes"] = max(total)
        for key in ("power_w", "sm_clock_mhz"):
            if (mm := _mean_max(col(key))) is not None:
                out[key] = mm
        return out

    def _device_summary(self, index: int, series: list[dict]) -> dict:
        out = self._fields(series)
        energy = trapezoid_energy_j([(s["t_s"], s["power_w"]) for s in series if "power_w" in s])
        if energy is not None:
            out["energy_j"] = energy
        return out

    def validate(self) -> None:
        """Before the run: raise CbbenchError if `gpus` names a device NVML does not see.

        Without a driver this passes; `start()` then says so once and records nothing.
        """
        if self.gpus is None or not self._init():
            return
        try:
            self._check_indices(self._nvml.nvmlDeviceGetCount())
        finally:
            self._nvml.nvmlShutdown()

    def _init(self) -> bool:
        """Import and initialise NVML; False (with a reason) when there is no driver."""
        if self._nvml is None:
            try:
                self._nvml = importlib.import_module("pynvml")
            except ImportError:
                self.unavailable_reason = "pynvml (nvidia-ml-py) is not installed"
                return False
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as exc:
            self.unavailable_reason = f"{NO_DRIVER} ({exc})"
            return False
        return True

    def _check_indices(self, count: int) -> list[int]:
        indices = list(range(count)) if self.gpus is None else list(self.gpus)
        missing = [i for i in indices if not 0 <= i < count]
        if missing:
            raise CbbenchError(
                f"--gpus: no NVIDIA device {missing[0]} (NVML sees {count}: 0..{count - 1})"
            )
        return indices

    def _open(self) -> bool:
        """Initialise NVML and pick devices; False (with a reason) when there is no GPU."""
        if not self._init():
            return False
        nvml = self._nvml
        try:
            count = nvml.nvmlDeviceGetCount()
            if count == 0:
                self.unavailable_reason = "no NVIDIA GPU (NVML reports 0 devices)"
            else:
                for i in self._check_indices(count):
                    self._handles[i] = nvml.nvmlDeviceGetHandleByIndex(i)
                    name = nvml.nvmlDeviceGetName(self._handles[i])
                    self.device_names[i] = name.decode() if isinstance(name, bytes) else str(name)
                    self._series[i] = []
        except nvml.NVMLError as exc:
            self.unavailable_reason = f"NVML could not open the GPUs ({exc})"
        except CbbenchError:
            nvml.nvmlShutdown()
            raise
        if self.unavailable_reason is not None:
            self._handles, self.device_names, self._series = {}, {}, {}
            nvml.nvmlShutdown()
            return False
        return True

    def _loop(self) -> None:
        next_t = time.monotonic()
        while True:
            self._sample_all()
            next_t = max(next_t + self.interval_s, time.monotonic())
            if self._stop.wait(next_t - time.monotonic()):
                break
        self.cpu_s = time.thread_time()  # this thread's CPU: what sampling cost the client

    def _sample_all(self) -> None:
        for index, handle in self._handles.items():
            sample = self._read(index, handle)
            with self._lock:
                self._series[index].append(sample)
                self._latest[index] = sample
            self._sink(sample)

    def _read(self, index: int, handle: object) -> dict:
        nvml = self._nvml
        sample: dict = {
            "t_s": (time.monotonic_ns() - self._t0_ns) / 1e9,
            "source": "gpu",
            "index": index,
        }
        reads: list[tuple[str, Callable[[], dict]]] = [
            ("utilization", lambda: self._util(handle)),
            ("memory", lambda: self._memory(handle)),
            ("power", lambda: {"power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0}),
            (
                "clock",
                lambda: {"sm_clock_mhz": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)},
            ),
        ]
        for what, read in reads:
            try:
                sample.update(read())
            except nvml.NVMLError as exc:  # e.g. power not supported: the field stays absent
                with self._lock:
                    self.failures += 1
                    self.last_error = f"device {index} {what}: {exc}"
        return sample

    def _util(self, handle: object) -> dict:
        u = self._nvml.nvmlDeviceGetUtilizationRates(handle)
        return {"util_gpu": float(u.gpu), "util_mem": float(u.memory)}

    def _memory(self, handle: object) -> dict:
        m = self._nvml.nvmlDeviceGetMemoryInfo(handle)
        return {"mem_used_bytes": int(m.used), "mem_total_bytes": int(m.total)}
