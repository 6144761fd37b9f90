"""Where a run happened, for run.json: cbbench and library versions, Python, OS, CPU, GPU.

The GPU comes from NVML (nvidia-ml-py) when a driver is there; without one the key is absent,
never zero or a guess.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def gpus() -> list[dict] | None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no library, no driver, no device: all mean "no NVIDIA GPU here"
        return None
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            out.append(
                {
                    "index": i,
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "memory_total_bytes": int(mem.total),
                }
            )
        driver = pynvml.nvmlSystemGetDriverVersion()
        for g in out:
            g["driver"] = driver.decode() if isinstance(driver, bytes) else driver
        return out
    except Exception:
        return None
    finally:
        pynvml.nvmlShutdown()


def environment() -> dict:
    env = {
        "cbbench_version": _version("cbbench"),
        "python": platform.python_version(),
        "os": platform.platform(),
        "hostname": platform.node(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "libraries": {n: _version(n) for n in ("httpx", "numpy", "pandas", "rich", "torch")},
    }
    found = gpus()
    if found:
        env["gpus"] = found
    return env
