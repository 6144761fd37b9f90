"""Where a run happened, for run.json: cbbench and library versions, Python, OS, CPU, GPU.

The GPUs come from NVML (nvidia-ml-py): model, memory, driver, one entry each. A host without
one says so once: `gpus` is empty and `gpu` tells why (no NVML library, no driver, no
device), never zero or a guess. The server's own word (`server`, harness/client/server_info.py)
is added by the commands that talk to one.
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


_NO_GPU: list[str] = []  # why the last gpus() call found none


def gpus() -> list[dict] | None:
    _NO_GPU.clear()
    try:
        import pynvml
    except ImportError:
        _NO_GPU.append("no GPU found: nvidia-ml-py (NVML) is not installed")
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no library, no driver, no device: all mean "no NVIDIA GPU here"
        _NO_GPU.append(f"no GPU found: NVML could not start ({type(exc).__name__}: {exc})")
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
        if not out:
            _NO_GPU.append("no GPU found: NVML sees 0 devices")
        return out
    except Exception as exc:
        _NO_GPU.append(f"no GPU found: NVML failed ({type(exc).__name__})")
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
    env["gpus"] = found or []
    if not found:
        env["gpu"] = _NO_GPU[0] if _NO_GPU else "no GPU found"
    return env


def gpu_line(env: dict) -> str:
    """One line for a report header: the GPUs, or why there are none."""
    found = env.get("gpus") or []
    if found:
        mem = found[0].get("memory_total_bytes")
        size = f", {mem / 2**30:.0f} GiB" if mem else ""
        return f"{len(found)} x {found[0].get('name')}{size}, driver {found[0].get('driver')}"
    return env.get("gpu") or "not recorded"
